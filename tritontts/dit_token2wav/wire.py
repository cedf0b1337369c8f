"""Both ends of the `token2wav_dit` model's Triton inputs, upstream's: `target_speech_tokens` (speech ids + 151663),
`reference_wav` FP32 [1, N] at 16 kHz with `reference_wav_len` INT32 [1, 1], and `finalize` BOOL [1, 1].

The model keeps a stream's caches under the request id until a call with `finalize` true; without `finalize`
the tokens are one whole utterance.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tritontts.audio import AudioError, AudioLimits, check_waveform
from tritontts.cosyvoice2.frontend import INPUT_SAMPLE_RATE
from tritontts.cosyvoice2.wire import speech_ids, wire_ids
from tritontts.triton.params import RequestError

REFERENCE_WAV = "reference_wav"
REFERENCE_WAV_LEN = "reference_wav_len"


@dataclass(frozen=True)
class DiTToken2WavInputs:
    tokens: np.ndarray
    """int32 `[n]`, 0..6560"""
    reference_wav: np.ndarray
    """float32 `[N]`, 16 kHz"""
    finalize: bool | None
    """None: one whole utterance; else one call of a stream"""


def dit_token2wav_arrays(
    tokens: np.ndarray, reference_wav: np.ndarray, finalize: bool | None = None
) -> dict[str, np.ndarray]:
    """The request tensors for tokens 0..6560 and a 16 kHz reference."""
    wav = np.asarray(reference_wav, dtype=np.float32).reshape(1, -1)
    arrays = {
        "target_speech_tokens": wire_ids(tokens),
        REFERENCE_WAV: wav,
        REFERENCE_WAV_LEN: np.array([[wav.shape[1]]], dtype=np.int32),
    }
    if finalize is not None:
        arrays["finalize"] = np.array([[bool(finalize)]], dtype=np.bool_)
    return arrays


def parse_dit_token2wav_inputs(
    arrays: Mapping[str, np.ndarray | None], limits: AudioLimits | None = None
) -> DiTToken2WavInputs:
    """The model-side view of one request's inputs (None for an absent one); RequestError naming the field."""
    for name in ("target_speech_tokens", REFERENCE_WAV, REFERENCE_WAV_LEN):
        if arrays.get(name) is None:
            raise RequestError(name, "is required")
    finalize = arrays.get("finalize")
    finalize = None if finalize is None else bool(finalize.reshape(-1)[0])
    # a stream's last call with no tokens left ends it (the BLS's end of a stream cut short)
    if finalize and arrays["target_speech_tokens"].size == 0:
        tokens = np.zeros(0, dtype=np.int32)
    else:
        tokens = speech_ids(arrays["target_speech_tokens"], "target_speech_tokens").numpy().reshape(-1)
    wav, length = arrays[REFERENCE_WAV], arrays[REFERENCE_WAV_LEN].reshape(-1)
    if wav.ndim != 2 or wav.shape[0] != 1:
        raise RequestError(REFERENCE_WAV, f"must hold one audio per request, got shape {tuple(wav.shape)}")
    if length.size != 1 or not 0 < int(length[0]) <= wav.shape[1]:
        raise RequestError(
            REFERENCE_WAV_LEN, f"must be one value in 1..{wav.shape[1]}, got {length.tolist()}"
        )
    try:
        reference = check_waveform(
            wav[0, : int(length[0])], INPUT_SAMPLE_RATE, limits or AudioLimits(), REFERENCE_WAV
        )
    except AudioError as err:
        raise RequestError(REFERENCE_WAV, str(err).removeprefix(f"{REFERENCE_WAV} ")) from err
    return DiTToken2WavInputs(tokens, reference, finalize)
