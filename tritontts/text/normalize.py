"""Text normalization as upstream's `text_normalize(text, split=False)` with its wetext front end.

Chinese (any CJK ideograph in the text): wetext's Chinese TN (erhua kept), then newlines removed, blanks removed
except between ASCII words, ² and ³ spoken, "." as "。", " - " as "，", full-width brackets and backticks dropped,
"——" as a blank, and trailing commas as "。". Otherwise English: wetext's English TN, then the digits left over
spelled out by inflect. A text holding a special token (`<|` and `|>`) is returned as it is, as upstream returns
it; so is an empty one. A sentence wetext fails on (its grammars cannot tag a few odd texts; upstream would
raise) is kept as written, the rules after wetext still applied. Tags (`[laughter]`, `<strong>`) come through
wetext unchanged in practice; should a tag ever come out changed, the text between the tags is normalized piece
by piece instead and the tags put back.

The wetext grammars (about 60 MB in memory) and inflect load at the first call, or at `load()` (the speech API
calls it at startup). One normalizer may serve many threads: calls take turns (inflect's engine keeps state while
it spells a number).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
from typing import Any

from tritontts.text.cleanup import (
    contains_chinese,
    remove_bracket,
    replace_blank,
    replace_corner_mark,
    trailing_comma_to_stop,
)
from tritontts.text.numbers import spell_out_numbers
from tritontts.text.tags import TAG, split_at_tags, tags_of

log = logging.getLogger("tritontts.text")
_SENTENCE = re.compile(r"(?<=[。！？；!?;.\n])")


def skips_normalization(text: str) -> bool:
    """Upstream's rule: a text with a special token (`<|…|>`, e.g. CosyVoice3's `<|endofprompt|>`) is not
    normalized (nor split)."""
    return "<|" in text and "|>" in text


def language(text: str) -> str:
    """ "zh" when the text holds a Chinese character, else "en": which of upstream's two paths it takes."""
    return "zh" if contains_chinese(text) else "en"


class NormalizationUnavailable(RuntimeError):
    """wetext or inflect (requirements.txt) cannot be imported here."""


@functools.cache
def unavailable_reason() -> str | None:
    """None when the text front end's libraries import; otherwise why not (e.g. "No module named 'wetext'")."""
    try:
        import inflect  # noqa: F401
        import wetext  # noqa: F401
    except ImportError as err:
        return str(err)
    return None


def check_available() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise NormalizationUnavailable(
            f"text normalization needs wetext and inflect (both in requirements.txt): {reason}; install them, "
            "or start the speech API with --no-text-normalization"
        )


class TextNormalizer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._zh: Any = None
        self._en: Any = None
        self._speller: Any = None

    def load(self) -> None:
        """Load the grammars now (about 2 s) rather than at the first call; NormalizationUnavailable without them."""
        with self._lock:
            self._load()

    def _load(self) -> None:
        if self._speller is not None:
            return
        check_available()
        import inflect
        from wetext import Normalizer

        self._zh = Normalizer(remove_erhua=False)
        self._en = Normalizer()
        self._speller = inflect.engine()

    def normalize(self, text: str, lang: str | None = None) -> str:
        """`text` normalized; `lang` ("zh" or "en") forces the path a longer text chose (long_form.py)."""
        if not text or skips_normalization(text):
            return text
        text = text.strip()
        lang = lang or language(text)
        with self._lock:
            self._load()
            out = self._finish(self._wetext(text, lang), lang)
            if tags_of(out) == tags_of(text):
                return out
            pieces = split_at_tags(text)  # text, tag, text, ...: only the text pieces go through wetext
            joined = "".join(p if i % 2 else self._wetext(p, lang) for i, p in enumerate(pieces))
            return self._finish(joined, lang)

    def _wetext(self, text: str, lang: str) -> str:
        core = text.strip()
        if not core or TAG.fullmatch(core):
            return text
        head, tail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
        try:
            return head + (self._zh if lang == "zh" else self._en).normalize(core) + tail
        except Exception as err:  # wetext fails on a few texts its grammars cannot tag (an AssertionError)
            sentences = [s for s in _SENTENCE.split(core) if s]
            if len(sentences) > 1:
                return head + "".join(self._wetext(s, lang) for s in sentences) + tail
            log.warning(
                "wetext cannot normalize %r (%s: %s); kept as written", core[:80], type(err).__name__, err
            )
            return text

    def _finish(self, text: str, lang: str) -> str:
        if lang != "zh":
            return spell_out_numbers(text, self._speller)
        text = replace_blank(text.replace("\n", ""))
        text = replace_corner_mark(text).replace(".", "。").replace(" - ", "，")
        return trailing_comma_to_stop(remove_bracket(text))
