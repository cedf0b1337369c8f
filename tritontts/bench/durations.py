"""How long a text takes to say: a rough, documented estimate used to give synthetic models realistic lengths.

Each CJK ideograph, kana or hangul syllable is one spoken syllable, read at `CJK_SYLLABLES_PER_SECOND`
(Mandarin read speech runs at about 4-5 syllables per second; 4.2 leaves room for pauses). Every other run
of letters or digits (apostrophes inside kept, so "o'clock" is one) is one word, read at `WORDS_PER_SECOND`
(about 160 words per minute, ordinary English read speech). Punctuation and spaces add nothing. Digits are
counted as one word per run, however many syllables they are read with.
"""

from __future__ import annotations

import math
import re

CJK_SYLLABLES_PER_SECOND = 4.2
WORDS_PER_SECOND = 2.7
TOKEN_RATE = 50

CJK_PATTERN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
WORD_PATTERN = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def count_cjk_syllables(text: str) -> int:
    return len(CJK_PATTERN.findall(text))


def count_words(text: str) -> int:
    """Runs of letters or digits outside the CJK characters."""
    return len(WORD_PATTERN.findall(CJK_PATTERN.sub(" ", text)))


def expected_seconds(text: str) -> float:
    return count_cjk_syllables(text) / CJK_SYLLABLES_PER_SECOND + count_words(text) / WORDS_PER_SECOND


def expected_tokens(text: str, token_rate: int = TOKEN_RATE) -> int:
    """Semantic tokens a real model would generate for `text`: `token_rate` per expected second, at least 1."""
    return max(1, math.ceil(expected_seconds(text) * token_rate - 1e-9))
