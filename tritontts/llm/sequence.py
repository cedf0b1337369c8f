"""One request's sampling parameters, state while it runs, and the events it streams back."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings (TensorRT-LLM names in comments).

    temperature 0 or top_k 1 is greedy. top_k 0 means "no top-k limit": the candidates are then the
    engine's `max_top_k` most likely tokens (the whole vocabulary when it is smaller), and top_p applies
    within them; a top_k above max_top_k is clamped to it. end_id None (or < 0) never stops early; min_tokens masks end_id until that many tokens
    were generated. The end token itself is not part of the output. bad_token_ids are never sampled (TensorRT-LLM's
    `bad_words_list`, single-token words only).
    """

    max_tokens: int = 512  # request_output_len
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # random_seed
    end_id: int | None = None
    pad_id: int | None = None
    bad_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "bad_token_ids", tuple(int(t) for t in self.bad_token_ids))
        if any(t < 0 for t in self.bad_token_ids):
            raise ValueError(f"bad_token_ids must be >= 0, got {list(self.bad_token_ids)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


class FinishReason(str, enum.Enum):
    END_ID = "end_id"
    MAX_TOKENS = "max_tokens"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class TokenEvent:
    """New tokens of one request; the last event of a request has `finish_reason` set (tokens may be empty)."""

    request_id: int
    token_ids: list[int]
    finish_reason: FinishReason | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(eq=False)
class Sequence:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    max_tokens: int
    on_tokens: Callable[[TokenEvent], None] | None = None
    output_ids: list[int] = field(default_factory=list)
    slot: int | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    first_token_at: float | None = None
    """time.monotonic() when the engine streamed its first token"""

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def accept(self, token: int) -> list[int]:
        """Take one sampled token; return what to stream (empty for the end token) and set finish_reason."""
        end_id = self.params.end_id
        if (
            end_id is not None
            and end_id >= 0
            and token == end_id
            and len(self.output_ids) >= self.params.min_tokens
        ):
            self.finish_reason = FinishReason.END_ID
            return []
        self.output_ids.append(token)
        if len(self.output_ids) >= self.max_tokens:
            self.finish_reason = FinishReason.MAX_TOKENS
        return [token]
