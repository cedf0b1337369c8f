"""The text front end's settings, upstream's values by default."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextConfig:
    normalize: bool = True
    """run the normalizer (wetext + inflect + clean-up); off, the text is only segmented"""
    token_max_n: int = 80
    """a segment grows past this many tokens only while it holds at most token_min_n"""
    token_min_n: int = 60
    merge_len: int = 20
    """a last segment shorter than this is merged into the one before"""
    comma_split: bool = False
    """commas end sentences too (upstream's front end: no)"""
    block_chars: int = 600
    """a long text is normalized this many characters at a time (cut at a line or sentence end before it), so
    the first segment does not wait for the whole text; a shorter text is normalized whole, as upstream does"""
    max_segment_chars: int = 1000
    """a segment longer than this (a sentence without punctuation) is cut at a blank, comma or between CJK
    characters; the BLS's max_text_length"""


DEFAULT = TextConfig()
