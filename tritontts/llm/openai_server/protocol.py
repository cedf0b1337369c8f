"""Request bodies of the completions endpoints (OpenAI's fields, plus top_k, repetition_penalty, min_tokens).

`logit_bias` takes only -100 (never generate that token id: the engine's bad token ids); other biases are refused.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SamplingFields(BaseModel):
    """Fields both endpoints share; unknown fields are ignored, as OpenAI-compatible servers do."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    min_tokens: int = Field(default=0, ge=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=-1)
    repetition_penalty: float = Field(default=1.0, gt=0)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def banned_ids(self) -> tuple[int, ...]:
        """The token ids of `logit_bias` (all biased -100); raises ValueError for any other entry."""
        ids = []
        for key, bias in (self.logit_bias or {}).items():
            if not key.strip().isdigit():
                raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
            if bias != -100:
                raise ValueError(f"logit_bias supports only -100 (ban the token), got {bias} for {key}")
            ids.append(int(key))
        return tuple(ids)

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
