"""Chat messages to prompt text with the tokenizer's own jinja2 chat template (no transformers at runtime)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@dataclass(frozen=True)
class ChatTemplate:
    """`tokenizer_config.json`'s `chat_template`, rendered as Hugging Face's `apply_chat_template` does."""

    source: str
    special_tokens: dict[str, str | None]

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate | None:
        """None when the tokenizer declares no chat template."""
        config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not template:
            return None
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        special = {name: _token_text(config.get(name)) for name in names}
        return cls(template, special)

    def render(self, messages: list[dict], add_generation_prompt: bool, continue_final_message: bool) -> str:
        """The prompt text; with `continue_final_message` it ends right after the last message's content."""
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise_exception
        rendered = env.from_string(self.source).render(
            messages=messages, add_generation_prompt=add_generation_prompt, **self.special_tokens
        )
        if not continue_final_message:
            return rendered
        final = messages[-1]["content"].strip()
        end = rendered.rfind(final)
        if end < 0:
            raise TemplateError(
                "the chat template does not reproduce the final message, so it cannot continue"
            )
        return rendered[: end + len(final)]


def _token_text(token: str | dict | None) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
