"""The text front end in a BLS: its model parameter `text_normalization` (default on) and the request parameter
of the same name, which turns it off or on for one request (the speech API, having normalized and cut the text
itself, sends `false`). A request's `target_text` and `reference_text` are normalized after their checks (the
length limit applies to the text as sent); the instruction is left as written, as upstream leaves it."""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from tritontts.text.normalize import TextNormalizer, unavailable_reason
from tritontts.triton.params import RequestError

PARAMETER = "text_normalization"
R = TypeVar("R")


def wants_normalization(parameters: dict, default: bool) -> bool:
    """The request parameter `text_normalization` (a boolean), else the model's `default`."""
    value = parameters.get(PARAMETER, default)
    if not isinstance(value, bool):
        raise RequestError(PARAMETER, f"must be a boolean, got {value!r}")
    if value and (reason := unavailable_reason()) is not None:
        raise RequestError(PARAMETER, f"cannot be true here: this server cannot normalize text ({reason})")
    return value


def normalized_texts(request: R, normalizer: TextNormalizer) -> R:
    """`request` (a dataclass with `target_text` and `reference_text`) with both normalized; a text that would
    normalize to nothing is kept as it was."""
    changes = {}
    for field in ("target_text", "reference_text"):
        text = getattr(request, field)
        if text:
            changes[field] = normalizer.normalize(text) or text
    return replace(request, **changes)
