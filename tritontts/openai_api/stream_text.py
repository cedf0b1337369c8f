"""Text that arrives a few tokens at a time, cut into sentences (or clauses) as soon as each is complete.

The marks are the text front end's (tritontts.text.segment): a sentence ends at `。？！；.?!;` or a line end; a
clause also at `，、：,:`. A mark is complete once something follows it: closing quotes and further marks stay
with it; after an ASCII mark, a blank or a CJK character (so `3.5` and `e.g.` in the middle of a word wait); after
a full-width one, anything. A run of text longer than `max_chars` without a mark is cut at its last blank or
comma (fit_segment), so a speaker without punctuation is still spoken. Granularity `none` cuts nothing: the text
waits for `flush` (the client's `input.done`).
"""

from __future__ import annotations

from dataclasses import dataclass

from tritontts.text.cleanup import contains_chinese, is_only_punctuation
from tritontts.text.segment import CLOSING_QUOTES, COMMAS, SENTENCE_ENDS, fit_segment

GRANULARITIES = ("none", "sentence", "clause")
_WEAK = "：、:"
SENTENCE_MARKS = frozenset(c for c in SENTENCE_ENDS["zh"] + SENTENCE_ENDS["en"] if c not in _WEAK)
CLAUSE_MARKS = SENTENCE_MARKS | frozenset(_WEAK) | frozenset(COMMAS)
CLOSERS = frozenset(CLOSING_QUOTES) | frozenset("'’」』）)]】")


def speakable(text: str) -> bool:
    """Whether a piece holds something to say (not only blanks and punctuation)."""
    return not is_only_punctuation(text.strip())


def complete_pieces(text: str, marks: frozenset[str]) -> tuple[list[str], str]:
    """(the complete sentences at the head of `text`, the rest that may still grow)."""
    pieces: list[str] = []
    start = i = 0
    while i < len(text):
        char = text[i]
        if char == "\n":
            pieces.append(text[start : i + 1])
            start = i = i + 1
            continue
        if char not in marks:
            i += 1
            continue
        j = i + 1
        while j < len(text) and (text[j] in marks or text[j] in CLOSERS):
            j += 1
        if j == len(text):
            break
        if not char.isascii() or text[j].isspace() or contains_chinese(text[j]):
            pieces.append(text[start:j])
            start = j
        i = j
    return pieces, text[start:]


@dataclass
class SentenceBuffer:
    granularity: str = "sentence"
    max_chars: int = 1000
    text: str = ""

    def push(self, delta: str) -> list[str]:
        """Add `delta`; the sentences it completed, stripped, in order (none for granularity `none`)."""
        self.text += delta
        if self.granularity == "none":
            return []
        marks = CLAUSE_MARKS if self.granularity == "clause" else SENTENCE_MARKS
        done, self.text = complete_pieces(self.text, marks)
        if len(self.text) > self.max_chars:
            *cut, self.text = fit_segment(self.text, self.max_chars)
            done += cut
        return [piece.strip() for piece in done if speakable(piece)]

    def flush(self) -> str:
        """What is left, stripped ("" when nothing to say), and the buffer emptied."""
        text, self.text = self.text.strip(), ""
        return text if speakable(text) else ""
