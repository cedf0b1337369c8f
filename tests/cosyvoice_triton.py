"""What the CosyVoice2 and CosyVoice3 BLS tests on the real tritonserver share (tests/test_cosyvoice2_triton.py,
tests/test_cosyvoice3_triton.py): gRPC inference, forced token counts, the audio check, and the bad requests both
BLS refuse alike, naming the field (each test module adds its own)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_stream import make_inputs
from tritonclient.utils import InferenceServerException

SAMPLES_PER_TOKEN = 960  # 24 kHz, 2 mel frames of 480 samples per speech token


def reference_request(wav: np.ndarray, target_text: str, reference_text: str) -> dict:
    """A BLS request's inputs: `target_text` in the voice of `wav` (16 kHz) saying `reference_text`."""
    return {
        "target_text": np.array([[target_text.encode()]], dtype=object),
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        "reference_text": np.array([[reference_text.encode()]], dtype=object),
    }


def tokens(count: int) -> dict:
    """Request parameters that make the LLM give exactly `count` speech tokens."""
    return {"min_new_tokens": count, "max_new_tokens": count}


def infer(server, model: str, values: dict, output: str = "waveform", **kwargs) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return client.infer(model, make_inputs(values), **kwargs).as_numpy(output)
    finally:
        client.close()


def audible(audio: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(audio)) and 0 < np.abs(audio).max() <= 1.0)


def check_chunks(chunks: list[np.ndarray], sizes: list[int], count: int) -> None:
    """A stream's chunks have `sizes` and join into the audible audio of `count` tokens."""
    assert [c.size for c in chunks] == sizes
    joined = np.concatenate(chunks)
    assert joined.size == count * SAMPLES_PER_TOKEN and audible(joined)


def with_changes(values: dict, **changes) -> dict:
    return {**values, **changes}


def without(values: dict, *names: str) -> dict:
    return {k: v for k, v in values.items() if k not in names}


BAD_REQUESTS: dict[str, tuple[Callable[[dict], dict], str]] = {
    "empty target_text": (
        lambda v: with_changes(v, target_text=np.array([[b""]], dtype=object)),
        "target_text",
    ),
    "no target_text": (lambda v: without(v, "target_text"), "target_text"),
    "reference_text without reference_wav": (
        lambda v: without(v, "reference_wav", "reference_wav_len"),
        "reference_wav",
    ),
    "NaN audio": (
        lambda v: with_changes(v, reference_wav=np.full((1, 16000), np.nan, np.float32)),
        "reference_wav",
    ),
    "too long audio": (
        lambda v: with_changes(
            v,
            reference_wav=np.zeros((1, 16000 * 31), np.float32),
            reference_wav_len=np.array([[16000 * 31]], np.int32),
        ),
        "reference_wav",
    ),
    "float64 audio": (
        lambda v: with_changes(v, reference_wav=v["reference_wav"].astype(np.float64)),
        "reference_wav",
    ),
}


def check_refused_then_served(
    offline: Callable[[dict, int], np.ndarray], good: dict, case: tuple[Callable[[dict], dict], str]
) -> None:
    """`case` (make a bad request from `good`, the field its error names) is refused naming the field, and
    the server still serves `good` (10 tokens) right after."""
    make, field = case
    with pytest.raises(InferenceServerException, match=field):
        offline(make(good), 10)
    assert offline(good, 10).size == 10 * SAMPLES_PER_TOKEN
