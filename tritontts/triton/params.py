"""Helpers for python-backend `model.py` files: config parameters, validated inputs, error replies.

`triton_python_backend_utils` exists only inside the stub, so every helper that needs it takes the module as
its first argument (`pb_utils`); this file imports in plain Python.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")
_REQUIRED: Any = object()
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


class ParameterError(ValueError):
    """A model_config parameter is missing or cannot be parsed; the message names it."""


class RequestError(ValueError):
    """A request field that is missing or wrong; the message names the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"not a boolean: {text!r} (use true/false)")


def parse_auto_bool(text: str) -> bool | None:
    """`auto` (None: the callee decides) or a boolean."""
    return None if text.strip().lower() == "auto" else parse_bool(text)


def model_param(
    model_config: Mapping | str, name: str, type: Callable[[str], T] = str, default: T = _REQUIRED
) -> T:
    """The `parameters { key: name value { string_value: ... } }` entry of a model config, parsed by `type`.

    `model_config` is `json.loads(args["model_config"])` (or that JSON string). An absent parameter, or one
    whose value is still an unfilled `${placeholder}`, gives `default`, or raises `ParameterError` without one.
    """
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    model = config.get("name", "?")
    entry = (config.get("parameters") or {}).get(name)
    raw = entry.get("string_value") if isinstance(entry, Mapping) else entry
    if raw is None or str(raw).startswith("${") or (raw == "" and type is not str):
        if default is _REQUIRED:
            state = "is not set" if raw in (None, "") else f"was not filled in ({raw})"
            raise ParameterError(f"model '{model}': parameter '{name}' {state} in config.pbtxt")
        return default
    parse = parse_bool if type is bool else type
    try:
        return parse(str(raw))
    except (TypeError, ValueError) as err:
        kind = getattr(type, "__name__", str(type))
        raise ParameterError(
            f"model '{model}': parameter '{name}' = {raw!r} is not a valid {kind}: {err}"
        ) from err


def stream_instances(model_config: Mapping) -> int:
    """How many instances a stream may meet: 1 where a sequence batcher keeps each stream on one instance, else
    the instances the config asks for (all instance groups together; a KIND_GPU group's count on each GPU)."""
    if model_config.get("sequence_batching"):
        return 1
    return sum(_group_instances(group) for group in model_config.get("instance_group") or [{}])


def _group_instances(group: Mapping) -> int:
    count = int(group.get("count", 1))
    gpus = group.get("gpus") or []
    return count * len(gpus) if group.get("kind") == "KIND_GPU" and gpus else count


def single_instance_stream(instances: int, field: str) -> None:
    """Stream calls keep their state in one instance: a model with several refuses them, naming `field`."""
    if instances > 1:
        raise RequestError(
            field,
            f"stream calls need a model with one instance or a sequence batcher (this one has {instances} "
            "instances and none; a stream's state lives in the instance that served its first call)",
        )


def optional_input(
    pb_utils: Any, request: Any, name: str, dtype: Any = None, ndim: int | None = None
) -> np.ndarray | None:
    """The input tensor `name` as numpy, checked for dtype and rank; None if the request lacks it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return check_array(tensor.as_numpy(), name, dtype=dtype, ndim=ndim)


def required_input(
    pb_utils: Any, request: Any, name: str, dtype: Any = None, ndim: int | None = None
) -> np.ndarray:
    array = optional_input(pb_utils, request, name, dtype=dtype, ndim=ndim)
    if array is None:
        raise RequestError(name, "is required")
    return array


def waveform_input(
    pb_utils: Any, request: Any, name: str = "reference_wav", length_name: str = "reference_wav_len"
) -> np.ndarray:
    """One request's FP32 [1, N] audio cut to its INT32 [1, 1] length (the upstream Spark/CosyVoice inputs)."""
    wav = required_input(pb_utils, request, name, dtype=np.float32, ndim=2)
    length = required_input(pb_utils, request, length_name, dtype=np.int32).reshape(-1)
    if wav.shape[0] != 1 or length.size != 1:
        raise RequestError(name, f"must hold one audio per request, got {wav.shape[0]}")
    n = int(length[0])
    if not 0 < n <= wav.shape[1]:
        raise RequestError(length_name, f"must be in 1..{wav.shape[1]}, got {n}")
    return wav[0, :n]


def check_array(array: np.ndarray, name: str, dtype: Any = None, ndim: int | None = None) -> np.ndarray:
    if dtype is not None and array.dtype != np.dtype(dtype):
        raise RequestError(name, f"must be {np.dtype(dtype)}, got {array.dtype}")
    if ndim is not None and array.ndim != ndim:
        raise RequestError(name, f"must have {ndim} dimensions, got shape {list(array.shape)}")
    return array


def string_input(pb_utils: Any, request: Any, name: str, default: str | None = None) -> str:
    """The single UTF-8 string of a STRING (BYTES) input of any shape with one element."""
    array = optional_input(pb_utils, request, name)
    if array is None:
        if default is None:
            raise RequestError(name, "is required")
        return default
    return decode_strings(array, name, count=1)[0]


def decode_strings(array: np.ndarray, name: str, count: int | None = None) -> list[str]:
    values = array.reshape(-1).tolist()
    if count is not None and len(values) != count:
        raise RequestError(name, f"must hold {count} string(s), got {len(values)}")
    texts = []
    for value in values:
        if isinstance(value, str):
            texts.append(value)
            continue
        try:
            texts.append(bytes(value).decode("utf-8"))
        except (TypeError, UnicodeDecodeError) as err:
            raise RequestError(name, f"must be UTF-8 text ({err})") from err
    return texts


def string_tensor(
    pb_utils: Any, name: str, texts: str | list[str], shape: tuple[int, ...] | None = None
) -> Any:
    """A STRING output tensor holding UTF-8 `texts` (one string gives shape [1])."""
    items = [texts] if isinstance(texts, str) else list(texts)
    array = np.array([t.encode("utf-8") for t in items], dtype=np.object_)
    return pb_utils.Tensor(name, array.reshape(shape) if shape else array)


def error_response(pb_utils: Any, error: BaseException) -> Any:
    """An InferenceResponse carrying `error`: INVALID_ARG for a request error (any exception with a `field`,
    its message naming that field), INTERNAL with the exception's type otherwise."""
    bad_request = getattr(error, "field", None) is not None
    code_name = "INVALID_ARG" if bad_request else "INTERNAL"
    message = str(error) if bad_request else f"{type(error).__name__}: {error}"
    try:
        triton_error = pb_utils.TritonError(message, getattr(pb_utils.TritonError, code_name))
    except (AttributeError, TypeError):
        triton_error = pb_utils.TritonError(message)
    return pb_utils.InferenceResponse(output_tensors=[], error=triton_error)
