"""How long a text is in LLM tokens, for segmenting English (upstream counts with the LLM's own tokenizer).

The speech API has no tokenizer of the model it serves, so it counts the pieces a byte-level BPE pre-tokenizer
(Qwen2's, CosyVoice's) cuts a text into: a run of letters, one digit, a run of other symbols. A common English
word is one token of such a vocabulary, so the count is close; a rare word of several tokens counts as one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

TokenCount = Callable[[str], int]
_PIECE = re.compile(r"[^\W\d_]+|\d|[^\w\s]+|_+")


def approximate_token_count(text: str) -> int:
    return len(_PIECE.findall(text))
