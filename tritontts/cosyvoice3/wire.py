"""Both ends of CosyVoice3's `token2wav` and `vocoder` Triton inputs (upstream's model_repo_cosyvoice3).

Unlike CosyVoice2's, speech ids travel raw (0..6560: upstream's cosyvoice3 BLS no longer adds 151663). token2wav:
`target_speech_tokens` INT32 [-1]; `prompt_speech_tokens` INT32 [-1], `prompt_speech_feat` FP16 [-1, 80],
`prompt_spk_embedding` FP16 [-1] (all three or none: none = the model's cached speaker); optional `token_offset`
INT32 [1] and `finalize` BOOL [1] (absent: True) → `mel` FP32 [80, -1]. vocoder: `mel` FP32 [80, -1], `finalize`
BOOL [1] → `tts_speech` FP32 [-1].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from tritontts.cosyvoice2.spk2info import CachedSpeaker
from tritontts.cosyvoice2.wire import MEL_BINS, _floats, parse_prompt_inputs, prompt_arrays, speech_ids
from tritontts.triton.params import RequestError

TOKEN_MEL_RATIO = 2
PRE_LOOKAHEAD_LEN = 3


@dataclass(frozen=True)
class Token2MelCall:
    target: torch.Tensor
    """int32 `[1, n]`, 0..6560"""
    prompt_tokens: torch.Tensor
    """int32 `[1, m]`"""
    prompt_feat: torch.Tensor
    """`[1, 2 m, 80]`"""
    embedding: torch.Tensor
    """`[1, 192]`"""
    token_offset: int | None = None
    finalize: bool = True


def token2wav_arrays(
    target_tokens: np.ndarray,
    prompt_tokens: np.ndarray | None = None,
    prompt_feat: np.ndarray | None = None,
    embedding: np.ndarray | None = None,
    token_offset: int | None = None,
    finalize: bool | None = None,
) -> dict[str, np.ndarray]:
    """The request tensors (batch dim 1); prompt inputs all or none; `token_offset`/`finalize` when given."""
    arrays = {"target_speech_tokens": np.asarray(target_tokens, dtype=np.int32).reshape(1, -1)}
    if prompt_feat is not None:
        arrays |= prompt_arrays(np.asarray(prompt_tokens), prompt_feat, embedding)
    if token_offset is not None:
        arrays["token_offset"] = np.array([[token_offset]], dtype=np.int32)
    if finalize is not None:
        arrays["finalize"] = np.array([[bool(finalize)]], dtype=np.bool_)
    return arrays


def _scalar(array: np.ndarray | None, name: str, kind: type) -> int | bool | None:
    if array is None:
        return None
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise RequestError(name, f"takes one value, got {values.size}")
    return kind(values[0])


def parse_token2mel_inputs(
    arrays: Mapping[str, np.ndarray | None], default: CachedSpeaker | None
) -> Token2MelCall:
    """The model-side view of one request's inputs (None for an absent one); RequestError naming the field."""
    target = arrays.get("target_speech_tokens")
    if target is None:
        raise RequestError("target_speech_tokens", "is required")
    target_tokens = speech_ids(target, "target_speech_tokens", offset=0)
    prompt = parse_prompt_inputs(arrays, offset=0)
    if prompt is not None:
        prompt_tokens, prompt_feat, embedding = prompt
        if prompt_feat.shape[1] != TOKEN_MEL_RATIO * prompt_tokens.shape[1]:
            raise RequestError(
                "prompt_speech_feat",
                f"needs {TOKEN_MEL_RATIO} frames per prompt token ({TOKEN_MEL_RATIO * prompt_tokens.shape[1]}), "
                f"got {prompt_feat.shape[1]}",
            )
    elif default is not None:
        prompt_tokens, prompt_feat, embedding = default.speech_token, default.speech_feat, default.embedding
    else:
        raise RequestError("prompt_speech_tokens", "is required: this deployment has no cached speaker")
    offset = _scalar(arrays.get("token_offset"), "token_offset", int)
    finalize = _scalar(arrays.get("finalize"), "finalize", bool)
    finalize = True if finalize is None else finalize
    usable = target_tokens.shape[1] - (0 if finalize else PRE_LOOKAHEAD_LEN)
    if offset is not None and not 0 <= offset < usable:
        raise RequestError("token_offset", f"must be in 0..{usable - 1} for these tokens, got {offset}")
    if usable < 1:
        raise RequestError(
            "target_speech_tokens", f"needs more than {PRE_LOOKAHEAD_LEN} tokens without finalize"
        )
    return Token2MelCall(target_tokens, prompt_tokens, prompt_feat, embedding, offset, finalize)


def vocoder_arrays(mel: np.ndarray, finalize: bool) -> dict[str, np.ndarray]:
    return {
        "mel": np.asarray(mel, dtype=np.float32).reshape(1, MEL_BINS, -1),
        "finalize": np.array([[bool(finalize)]], dtype=np.bool_),
    }


def parse_vocoder_inputs(
    mel: np.ndarray | None, finalize: np.ndarray | None, lookahead: int
) -> tuple[torch.Tensor, bool]:
    """mel `[1, 80, T]` fp32 and the flag; a non-final call needs more than `lookahead` frames."""
    if mel is None:
        raise RequestError("mel", "is required")
    flag = _scalar(finalize, "finalize", bool)
    if flag is None:
        raise RequestError("finalize", "is required")
    values = _floats(mel, "mel", ()).reshape(-1)
    if values.numel() % MEL_BINS:
        raise RequestError("mel", f"must be [{MEL_BINS}, T], got {values.numel()} values")
    frames = values.numel() // MEL_BINS
    if frames == 0 or (not flag and frames <= lookahead):
        raise RequestError("mel", f"needs more than {0 if flag else lookahead} frames, got {frames}")
    return values.reshape(1, MEL_BINS, frames), flag
