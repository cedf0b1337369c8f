"""Character-level clean-up rules of upstream's Chinese path (`frontend_utils.py`), and the checks it uses:
which text counts as Chinese, which segment holds nothing to speak."""

from __future__ import annotations

import re
import unicodedata

_CJK = re.compile(r"[\u4e00-\u9fff]")
_CORNER_MARKS = {"²": "平方", "³": "立方"}
_DROPPED = "（）【】`"
_TRAILING_COMMAS = re.compile(r"[，,、]+$")


def contains_chinese(text: str) -> bool:
    """Whether a CJK unified ideograph (U+4E00..U+9FFF) occurs: upstream's choice of the Chinese path."""
    return _CJK.search(text) is not None


def replace_corner_mark(text: str) -> str:
    """Superscript two and three as the Chinese words for square and cubic."""
    for mark, word in _CORNER_MARKS.items():
        text = text.replace(mark, word)
    return text


def remove_bracket(text: str) -> str:
    """Full-width parentheses, lenticular brackets and backticks dropped; a double em dash becomes a blank."""
    text = text.translate({ord(c): None for c in _DROPPED})
    return text.replace("——", " ")


def replace_blank(text: str) -> str:
    """A blank stays only between two printable ASCII characters that are not blanks themselves (a blank
    between English words); every other blank goes (Chinese needs none). A blank at either end goes too."""
    kept = []
    for i, char in enumerate(text):
        if char != " ":
            kept.append(char)
            continue
        before = text[i - 1] if i > 0 else ""
        after = text[i + 1] if i + 1 < len(text) else ""
        if before.isascii() and after.isascii() and before not in ("", " ") and after not in ("", " "):
            kept.append(char)
    return "".join(kept)


def trailing_comma_to_stop(text: str) -> str:
    """Commas or enumeration commas that end the text become one Chinese full stop."""
    return _TRAILING_COMMAS.sub("。", text)


def is_only_punctuation(text: str) -> bool:
    """True for an empty text or one made only of punctuation and symbols (Unicode categories P* and S*)."""
    return all(unicodedata.category(char)[0] in "PS" for char in text)
