"""Both ends of the `token2wav` model's Triton inputs (upstream's names, dtypes and +151663 speech ids)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from tritontts.cosyvoice2.prompt import check_speech_tokens
from tritontts.cosyvoice2.spk2info import CachedSpeaker
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.triton.params import RequestError

PROMPT_INPUTS = ("prompt_speech_tokens", "prompt_speech_feat", "prompt_spk_embedding")
TOKEN2WAV_INPUTS = ("target_speech_tokens", *PROMPT_INPUTS, "token_offset", "finalize")
"""Every input of upstream's token2wav call (CosyVoice2's and CosyVoice3's alike)."""
EMBEDDING_DIM = 192
MEL_BINS = 80


@dataclass(frozen=True)
class Token2WavInputs:
    target: torch.Tensor
    """int32 `[1, n]`, 0..6560"""
    prompt_tokens: torch.Tensor
    """int32 `[1, m]`, 0..6560"""
    prompt_feat: torch.Tensor
    """`[1, 2 m, 80]`"""
    embedding: torch.Tensor
    """`[1, 192]`"""
    token_offset: int | None = None
    finalize: bool | None = None


def token2wav_arrays(
    target_tokens: np.ndarray,
    prompt_tokens: np.ndarray | None = None,
    prompt_feat: np.ndarray | None = None,
    embedding: np.ndarray | None = None,
    token_offset: int | None = None,
    finalize: bool | None = None,
) -> dict[str, np.ndarray]:
    """The request tensors for tokens 0..6560; prompt inputs all or none (none: the model's cached speaker)."""
    arrays = {"target_speech_tokens": wire_ids(target_tokens)}
    if prompt_feat is not None:
        arrays |= prompt_arrays(wire_ids(prompt_tokens), prompt_feat, embedding)
    if token_offset is not None:
        arrays["token_offset"] = np.array([[token_offset]], dtype=np.int32)
        arrays["finalize"] = np.array([[bool(finalize)]], dtype=np.bool_)
    return arrays


def prompt_arrays(
    prompt_ids: np.ndarray, prompt_feat: np.ndarray, embedding: np.ndarray
) -> dict[str, np.ndarray]:
    """The three prompt inputs, the speech ids already in their wire form."""
    return {
        "prompt_speech_tokens": np.asarray(prompt_ids, dtype=np.int32).reshape(1, -1),
        "prompt_speech_feat": np.asarray(prompt_feat, dtype=np.float16).reshape(1, -1, MEL_BINS),
        "prompt_spk_embedding": np.asarray(embedding, dtype=np.float16).reshape(1, -1),
    }


def wire_ids(tokens: np.ndarray) -> np.ndarray:
    return (np.asarray(tokens, dtype=np.int32) + ORIGINAL_VOCAB_SIZE).reshape(1, -1)


def speech_ids(array: np.ndarray, name: str, offset: int = ORIGINAL_VOCAB_SIZE) -> torch.Tensor:
    """Wire ids (speech token + `offset`) → tokens int32 `[1, n]` 0..6560; RequestError naming `name`."""
    if array.dtype != np.int32:
        raise RequestError(name, f"must be int32, got {array.dtype}")
    values = array.reshape(-1).astype(np.int64) - offset
    if values.size == 0:
        raise RequestError(name, "is empty")
    try:
        check_speech_tokens(values.tolist(), name)
    except ValueError as err:
        ids = f"(6561 ids from {offset})" if offset else "0..6560 (raw, no offset)"
        raise RequestError(name, f"ids must be speech tokens {ids}: {err}") from err
    return torch.from_numpy(values.astype(np.int32)).reshape(1, -1)


def parse_prompt_inputs(
    arrays: Mapping[str, np.ndarray | None], offset: int = ORIGINAL_VOCAB_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(prompt tokens `[1, m]`, mel `[1, T, 80]`, embedding `[1, 192]`), or None when none of the three inputs
    is given; RequestError naming the field when only some are, or one is malformed."""
    given = [name for name in PROMPT_INPUTS if arrays.get(name) is not None]
    if not given:
        return None
    if len(given) != len(PROMPT_INPUTS):
        missing = next(name for name in PROMPT_INPUTS if name not in given)
        raise RequestError(missing, f"is required with {', '.join(given)}")
    prompt_tokens = speech_ids(arrays["prompt_speech_tokens"], "prompt_speech_tokens", offset)
    prompt_feat = _floats(arrays["prompt_speech_feat"], "prompt_speech_feat", (MEL_BINS,))
    embedding = _floats(arrays["prompt_spk_embedding"], "prompt_spk_embedding", ()).reshape(1, -1)
    if embedding.shape[1] != EMBEDDING_DIM:
        raise RequestError(
            "prompt_spk_embedding", f"must hold {EMBEDDING_DIM} values, got {embedding.shape[1]}"
        )
    return prompt_tokens, prompt_feat, embedding


def _floats(array: np.ndarray, name: str, shape_tail: tuple[int, ...]) -> torch.Tensor:
    if not np.issubdtype(array.dtype, np.floating):
        raise RequestError(name, f"must be float16, got {array.dtype}")
    values = np.asarray(array, dtype=np.float32).reshape(1, -1, *shape_tail)
    if not np.isfinite(values).all():
        raise RequestError(name, "holds NaN or infinite values")
    return torch.from_numpy(values)


def parse_token2wav_inputs(
    arrays: Mapping[str, np.ndarray | None], default: CachedSpeaker
) -> Token2WavInputs:
    """The model-side view of one request's inputs (None for an absent one); RequestError naming the field."""
    target = arrays.get("target_speech_tokens")
    if target is None:
        raise RequestError("target_speech_tokens", "is required")
    prompt = parse_prompt_inputs(arrays)
    if prompt is not None:
        prompt_tokens, prompt_feat, embedding = prompt
        if prompt_feat.shape[1] < 2 * prompt_tokens.shape[1]:
            raise RequestError(
                "prompt_speech_feat",
                f"needs 2 frames per prompt token ({2 * prompt_tokens.shape[1]}), got {prompt_feat.shape[1]}",
            )
    else:
        prompt_tokens, prompt_feat, embedding = default.speech_token, default.speech_feat, default.embedding
    offset, finalize = arrays.get("token_offset"), arrays.get("finalize")
    if (offset is None) != (finalize is None):
        raise RequestError(
            "finalize" if finalize is None else "token_offset", "token_offset and finalize go together"
        )
    token_offset = None
    if offset is not None:
        token_offset = int(np.asarray(offset).reshape(-1)[0])
        target_len = target.reshape(-1).size
        if not 0 <= token_offset < target_len:
            raise RequestError("token_offset", f"must be in 0..{target_len - 1}, got {token_offset}")
        finalize = bool(np.asarray(finalize).reshape(-1)[0])
    return Token2WavInputs(
        speech_ids(target, "target_speech_tokens"),
        prompt_tokens,
        prompt_feat,
        embedding,
        token_offset,
        finalize,
    )
