"""Tags a text may carry for the LLM, which normalization must leave as they are: CosyVoice's fine-grained
control tags (`[laughter]`, `[breath]`, `<strong>…</strong>`) and special tokens (`<|endofprompt|>`)."""

from __future__ import annotations

import re

TAG = re.compile(r"<\|[^<>|\s]+\|>|\[[A-Za-z][\w-]*\]|</?[A-Za-z][\w-]*>")
"""`<|special|>`, `[word]` and `<word>` / `</word>`"""


def tags_of(text: str) -> list[str]:
    return TAG.findall(text)


def split_at_tags(text: str) -> list[str]:
    """`text` as alternating pieces: text, tag, text, ..., text (the first and last may be empty)."""
    pieces, start = [], 0
    for match in TAG.finditer(text):
        pieces += [text[start : match.start()], match.group()]
        start = match.end()
    return [*pieces, text[start:]]
