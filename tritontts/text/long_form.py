"""A text of any length as the segments to synthesize one after another.

The text is read a block at a time (`TextConfig.block_chars`, cut at a line end, else a sentence end, else a
blank), each block normalized (normalize.py) and split (segment.py) when it is reached: the first segment is
ready after the first block, whatever the length of the text, and a text no longer than one block is normalized
and split whole, exactly as upstream's `text_normalize(text, split=True)`. Upstream's path (Chinese or English)
is chosen once for the whole text. Segments of only punctuation are dropped, as upstream drops them; each
segment is cut to `max_segment_chars` where it can be (fit_segment).

A text carrying CosyVoice3's `<|endofprompt|>` keeps everything up to the last one (the system prompt or an
instruction) as a prefix of every segment, and, as upstream, is not normalized.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tritontts.text.cleanup import is_only_punctuation
from tritontts.text.config import DEFAULT, TextConfig
from tritontts.text.normalize import TextNormalizer, language, skips_normalization
from tritontts.text.segment import fit_segment, split_paragraph
from tritontts.text.tokens import TokenCount, approximate_token_count

END_OF_PROMPT = "<|endofprompt|>"
_SENTENCE_END = re.compile(r"[。！？；!?;]|\.(?=\s)")


def prompt_prefix(text: str) -> tuple[str, str]:
    """(everything up to and with the last `<|endofprompt|>`, the rest); ("", text) without one."""
    cut = text.rfind(END_OF_PROMPT)
    if cut < 0:
        return "", text
    cut += len(END_OF_PROMPT)
    return text[:cut], text[cut:]


def _cut(text: str, limit: int) -> int:
    """Where the block starting `text` ends: after the last line end within `limit` characters, else the last
    sentence end, else the last blank; past `limit` at the first of these when there is none before it."""
    window = text[:limit]
    for found in (window.rfind("\n"), max((m.end() - 1 for m in _SENTENCE_END.finditer(window)), default=-1)):
        if found > 0:
            return found + 1
    blank = max(window.rfind(" "), window.rfind("\t"))
    if blank > 0:
        return blank + 1
    later = re.search(r"[\n \t。！？；!?;]", text[limit:])
    return len(text) if later is None else limit + later.end()


def blocks(text: str, limit: int) -> Iterator[str]:
    """`text` in consecutive blocks of about `limit` characters (see _cut); the whole text when it fits."""
    while len(text) > limit:
        end = _cut(text, limit)
        yield text[:end]
        text = text[end:]
    if text:
        yield text


def text_segments(
    text: str,
    normalizer: TextNormalizer | None,
    config: TextConfig = DEFAULT,
    count_tokens: TokenCount = approximate_token_count,
) -> Iterator[str]:
    """The segments of `text`, lazily; normalized when `config.normalize` (and `normalizer` is given). A text
    with nothing left to speak (only punctuation) comes back as one segment, stripped, for the BLS to judge."""
    prefix, body = prompt_prefix(text)
    normalize = config.normalize and normalizer is not None and not skips_normalization(text)
    lang = language(body)
    room = max(1, config.max_segment_chars - len(prefix))
    produced = False
    for block in blocks(body, config.block_chars):
        if not block.strip():
            continue
        if normalize:
            block = normalizer.normalize(block, lang)
        for segment in split_paragraph(block.strip(), lang, config, count_tokens):
            if is_only_punctuation(segment):
                continue
            for piece in fit_segment(segment, room):
                produced = True
                yield prefix + piece
    if not produced:
        yield text.strip()
