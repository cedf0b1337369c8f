"""A BLS's side of voice profiles and of the optional inputs of its voice modes.

A request with the parameter `voice_profile: true` gets the profile of its reference audio (outputs
`profile_*` and `profile_checkpoint`) instead of audio; a request with `voice_*` inputs brings a profile, whose
`voice_checkpoint` must match this deployment's checkpoint marker (tritontts.voice_profile.checkpoint_marker).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from tritontts.triton.params import (
    RequestError,
    decode_strings,
    error_response,
    optional_input,
    string_tensor,
)
from tritontts.voice_profile import (
    CHECKPOINT_INPUT,
    CHECKPOINT_OUTPUT,
    OUTPUT_PREFIX,
    PROFILE_PARAMETER,
    VoiceProfile,
    checkpoint_marker,
)


def request_parameters(request: Any) -> dict:
    raw = request.parameters() or "{}"
    try:
        parameters = json.loads(raw)
    except json.JSONDecodeError as err:
        raise RequestError("parameters", f"are not JSON: {err}") from None
    return parameters if isinstance(parameters, dict) else {}


def wants_profile(parameters: dict) -> bool:
    value = parameters.get(PROFILE_PARAMETER, False)
    if not isinstance(value, bool):
        raise RequestError(PROFILE_PARAMETER, f"must be a boolean, got {value!r}")
    return value


def optional_string(pb_utils: Any, request: Any, name: str) -> str | None:
    array = optional_input(pb_utils, request, name)
    return None if array is None else decode_strings(array, name, count=1)[0]


def optional_row(
    pb_utils: Any, request: Any, name: str, dtype: Any, trailing: tuple[int, ...] = ()
) -> np.ndarray | None:
    """One request's row of a `[1, ...]` input, checked for dtype and the sizes after the variable one."""
    array = optional_input(pb_utils, request, name, dtype=dtype)
    if array is None:
        return None
    if array.ndim != 2 + len(trailing) or array.shape[0] != 1 or tuple(array.shape[2:]) != trailing:
        shape = ", ".join(["1", "n", *map(str, trailing)])
        raise RequestError(name, f"must have shape [{shape}], got {list(array.shape)}")
    return array[0]


class CheckpointMarker:
    """The marker of the checkpoint files a BLS's voice models read, computed once, on first use."""

    def __init__(self, root: str | Path, exclude: Iterable[str | Path] = ()) -> None:
        self.root = Path(root)
        self.exclude = tuple(exclude)
        self._value: str | None = None
        self._lock = threading.Lock()

    @property
    def value(self) -> str:
        with self._lock:
            if self._value is None:
                self._value = checkpoint_marker(self.root, self.exclude)
            return self._value

    def check(self, pb_utils: Any, request: Any) -> None:
        """A profile's `voice_checkpoint`, when sent, must be this deployment's."""
        sent = optional_string(pb_utils, request, CHECKPOINT_INPUT)
        if sent is not None and sent != self.value:
            raise RequestError(
                CHECKPOINT_INPUT,
                f"the voice profile was made with checkpoint {sent}, this deployment runs {self.value}: "
                "make the profile again (or send the reference audio)",
            )


def profile_response(pb_utils: Any, profile: VoiceProfile) -> Any:
    tensors = [
        pb_utils.Tensor(OUTPUT_PREFIX + name, np.ascontiguousarray(np.asarray(value)[None]))
        for name, value in profile.arrays.items()
    ]
    tensors.append(string_tensor(pb_utils, CHECKPOINT_OUTPUT, [profile.checkpoint], shape=(1, 1)))
    return pb_utils.InferenceResponse(tensors)


def answer_profile(pb_utils: Any, request: Any, decoupled: bool, make: Callable[[], VoiceProfile]) -> Any:
    """The profile as the one response of the request: returned (offline) or sent with the final flag."""
    try:
        response = profile_response(pb_utils, make())
    except Exception as err:
        response = error_response(pb_utils, err)
    if not decoupled:
        return response
    request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    return None
