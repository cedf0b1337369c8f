"""Segmentation: upstream's `split_paragraph` (sentences merged into segments of token_min_n..token_max_n
tokens, a short tail merged back), and the cut of a segment still too long for one request."""

from __future__ import annotations

import re

from tritontts.text.config import DEFAULT, TextConfig
from tritontts.text.tokens import TokenCount, approximate_token_count

SENTENCE_ENDS = {
    "zh": ("。", "？", "！", "；", "：", "、", ".", "?", "!", ";"),
    "en": (".", "?", "!", ";", ":"),
}
COMMAS = ("，", ",")
CLOSING_QUOTES = ('"', "”")
_SOFT_BREAKS = set(" \t\n\r\u3000,，、;；:：")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")


def sentences(text: str, ends: tuple[str, ...]) -> list[str]:
    """`text` cut after every sentence end, a closing quote right after one staying with it.

    As upstream: a sentence end with nothing before it since the last cut adds no sentence (so "?!" keeps the
    "?" only), and the text is expected to end with a sentence end (what follows the last one is dropped)."""
    found: list[str] = []
    start = 0
    for i, char in enumerate(text):
        if char not in ends:
            continue
        if i > start:
            found.append(text[start : i + 1])
        if text[i + 1 : i + 2] in CLOSING_QUOTES and i + 1 < len(text):
            if found:
                found[-1] += text[i + 1]
            start = i + 2
        else:
            start = i + 1
    return found


def split_paragraph(
    text: str,
    lang: str,
    config: TextConfig = DEFAULT,
    count_tokens: TokenCount = approximate_token_count,
) -> list[str]:
    """Upstream's segments of `text` ("zh": lengths in characters; "en": in `count_tokens` tokens). A text not
    ending in a sentence end gets one ("。" for zh, "." for en) first."""
    if not text:
        return []
    ends = SENTENCE_ENDS[lang] + (COMMAS if config.comma_split else ())
    length = len if lang == "zh" else count_tokens
    if text[-1] not in ends:
        text += "。" if lang == "zh" else "."
    segments: list[str] = []
    current = ""
    for sentence in sentences(text, ends):
        if length(current + sentence) > config.token_max_n and length(current) > config.token_min_n:
            segments.append(current)
            current = ""
        current += sentence
    if current:
        if segments and length(current) < config.merge_len:
            segments[-1] += current
        else:
            segments.append(current)
    return segments


def _break_before(text: str, limit: int) -> int:
    """The last place at or before `limit` to cut `text`: after a blank or comma-like mark, or between two CJK
    characters; 0 if none."""
    for i in range(min(limit, len(text) - 1), 0, -1):
        if text[i - 1] in _SOFT_BREAKS:
            return i
        if _CJK.match(text[i - 1]) and _CJK.match(text[i]):
            return i
    return 0


def fit_segment(segment: str, max_chars: int) -> list[str]:
    """`segment` in pieces of at most `max_chars` characters, cut at the last blank, comma-like mark or CJK
    character boundary before the limit. A run with none of these (one word longer than the limit) stays whole:
    the BLS then refuses it, naming the field, rather than hearing a word cut in two."""
    pieces: list[str] = []
    rest = segment
    while len(rest) > max_chars:
        cut = _break_before(rest, max_chars)
        if cut == 0:
            break
        head, rest = rest[:cut].rstrip(), rest[cut:].lstrip()
        if head:
            pieces.append(head)
    if rest:
        pieces.append(rest)
    return pieces
