"""JSON objects from untrusted requests: strict UTF-8, bounded nesting, 64-bit integers, finite numbers and no lone
surrogates; anything else raises JsonBodyError naming the problem (the HTTP apps answer it with a 400)."""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 20
INT_RANGE = (-(2**63), 2**64 - 1)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEPS = str.maketrans({"[": "\x01", "{": "\x01", "]": "\xff", "}": "\xff"})
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


class JsonBodyError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def parse_json_object(raw: bytes | str, param: str | None = None) -> dict[str, Any]:
    """`raw` (a request body, or the form field `param`) as a JSON object."""
    where = f"'{param}'" if param else "the request body"

    def fail(problem: str) -> JsonBodyError:
        return JsonBodyError(f"{where} {problem}", param)

    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise fail(f"is not valid UTF-8: {err.reason} at byte {err.start}") from None
    if not raw.strip():
        raise fail("is empty: send a JSON object")
    if _too_deep(raw):
        raise fail(f"nests JSON deeper than {MAX_DEPTH} levels")

    def integer(text: str) -> int:
        digits = len(text.lstrip("-"))
        value = int(text) if digits <= MAX_INT_DIGITS else None
        if value is None or not INT_RANGE[0] <= value <= INT_RANGE[1]:
            shown = text if value is not None else text[:12] + "..."
            raise fail(f"has an integer of {digits} digits ({shown}): integers must fit in 64 bits")
        return value

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):
            raise fail(f"has a number out of range ({text[:24]}): numbers must be finite")
        return value

    def constant(name: str) -> float:
        raise fail(f"has {name}, which is not a JSON number: numbers must be finite")

    try:
        data = json.loads(raw, parse_int=integer, parse_float=number, parse_constant=constant)
    except json.JSONDecodeError as err:
        raise fail(f"is not valid JSON: {err}") from None
    except RecursionError:
        raise fail(f"nests JSON deeper than {MAX_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise fail(f"must be a JSON object, not {_JSON_TYPES.get(type(data), 'a number')}")
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as err:
            char = f"\\u{ord(err.object[err.start]):04x}"
            raise fail(f"has a lone UTF-16 surrogate ({char}), which is not valid Unicode") from None
    return data


def _too_deep(text: str) -> bool:
    """Whether brackets outside strings nest deeper than MAX_DEPTH (no nesting is deeper than the bracket count,
    so flat bodies are not scanned)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    steps = _NOT_BRACKET.sub("", _STRING.sub("", text)).translate(_STEPS).encode("latin-1")
    return max(accumulate(memoryview(steps).cast("b")), default=0) > MAX_DEPTH
