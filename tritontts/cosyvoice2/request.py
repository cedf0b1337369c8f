"""A CosyVoice2 request and its voice, checked: what the BLS parses its inputs into (tritontts.cosyvoice2.service
runs it).

Modes (upstream's front ends): `zero_shot` (the transcript and the reference's speech tokens prompt the LLM),
`cross_lingual` (neither) and `instruct2` (an instruction instead of both). The voice is a reference audio, a saved
profile's prompt features (`voice_*` inputs) or, with neither, the deployment's cached speaker.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tritontts.cosyvoice2.frontend import EMBEDDING_DIM, FEAT_FRAMES_PER_TOKEN, PROMPT_MEL
from tritontts.cosyvoice2.prompt import MODES, check_speech_tokens
from tritontts.cosyvoice2.spk2info import CachedSpeaker
from tritontts.spark.service import RequestLimits, TokenBudget, check_reference_wav, check_text
from tritontts.triton.params import RequestError


@dataclass(frozen=True)
class Voice:
    text: str
    speech_tokens: np.ndarray
    """int32 `[n]`, 0..6560"""
    speech_feat: np.ndarray | None = None
    """fp32 `[2 n, 80]`; None for the deployment's cached speaker"""
    embedding: np.ndarray | None = None
    """fp32 `[192]`; None for the deployment's cached speaker"""
    reference_wav: np.ndarray | None = None
    """the 16 kHz reference itself, kept for a token2wav that makes its own prompt (the DiT's)"""

    @classmethod
    def cached(cls, speaker: CachedSpeaker) -> Voice:
        return cls(speaker.prompt_text, speaker.speech_token[0].numpy().astype(np.int32))


@dataclass(frozen=True)
class CosyVoice2Request:
    reference_wav: np.ndarray | None
    reference_text: str
    target_text: str
    tokens: TokenBudget | None = None
    mode: str = "zero_shot"
    instruct_text: str = ""
    profile: Voice | None = None
    """a saved voice's prompt features (`voice_*` inputs): the front-end models are not called"""


@dataclass(frozen=True)
class ProfileInputs:
    """The `voice_*` inputs of a request, unchecked."""

    speech_tokens: np.ndarray
    speech_feat: np.ndarray | None = None
    spk_embedding: np.ndarray | None = None


def check_mode(mode: str | None, instruct_text: str | None) -> str:
    """The request's mode: the `mode` parameter, else `instruct2` with an instruct_text, else `zero_shot`."""
    if mode is None:
        return "instruct2" if instruct_text is not None else "zero_shot"
    if mode not in MODES:
        raise RequestError("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "instruct2" and instruct_text is None:
        raise RequestError("instruct_text", "is required in mode instruct2")
    if mode != "instruct2" and instruct_text is not None:
        raise RequestError("instruct_text", f"is only read in mode instruct2, not {mode}")
    return mode


def check_profile(inputs: ProfileInputs, flow_prompt: bool) -> Voice:
    """A profile's arrays, checked: tokens 0..6560; with the flow's prompt, a mel of 2 frames per token and a
    192-value embedding."""
    try:
        tokens = np.asarray(check_speech_tokens(inputs.speech_tokens.reshape(-1), "voice_speech_tokens"))
    except ValueError as err:
        raise RequestError("voice_speech_tokens", str(err).split(": ", 1)[-1]) from None
    tokens = tokens.astype(np.int32)
    if not flow_prompt:
        return Voice("", tokens)
    for name, value in (
        ("voice_speech_feat", inputs.speech_feat),
        ("voice_spk_embedding", inputs.spk_embedding),
    ):
        if value is None:
            raise RequestError(name, "is required with voice_speech_tokens")
    feat = np.asarray(inputs.speech_feat, dtype=np.float32)
    if feat.shape != (FEAT_FRAMES_PER_TOKEN * tokens.size, PROMPT_MEL.num_mels):
        raise RequestError(
            "voice_speech_feat",
            f"must be [{FEAT_FRAMES_PER_TOKEN * tokens.size}, {PROMPT_MEL.num_mels}] for {tokens.size} tokens, "
            f"got {list(feat.shape)}",
        )
    embedding = np.asarray(inputs.spk_embedding, dtype=np.float32).reshape(-1)
    if embedding.size != EMBEDDING_DIM:
        raise RequestError("voice_spk_embedding", f"must hold {EMBEDDING_DIM} values, got {embedding.size}")
    return Voice("", tokens, feat, embedding)


def check_request(
    reference_wav: np.ndarray | None,
    reference_text: str | None,
    target_text: str,
    limits: RequestLimits,
    tokens: TokenBudget | None = None,
    mode: str = "zero_shot",
    instruct_text: str | None = None,
    profile: Voice | None = None,
    profile_needs_wav: bool = False,
    transcript_optional: bool = False,
) -> CosyVoice2Request:
    """zero_shot: a reference (audio or profile) and its transcript, or neither (the cached speaker speaks);
    cross_lingual and instruct2: a reference or none, and no transcript. target_text is required.
    `transcript_optional` (CosyVoice3): a zero_shot reference without transcript reads as an empty one."""
    if profile is not None and reference_wav is None and profile_needs_wav:
        raise RequestError(
            "reference_wav", "is required with a voice profile here: token2wav takes the audio"
        )
    if profile is not None and reference_wav is not None and not profile_needs_wav:
        raise RequestError("voice_speech_tokens", "send either reference_wav or a voice profile, not both")
    has_reference = reference_wav is not None or profile is not None
    if mode != "zero_shot" and reference_text is not None:
        raise RequestError("reference_text", f"is not read in mode {mode} (upstream's front end drops it)")
    if mode == "zero_shot" and not has_reference and reference_text is not None:
        raise RequestError("reference_wav", "is required when reference_text is given")
    if mode == "zero_shot" and has_reference and reference_text is None and not transcript_optional:
        raise RequestError("reference_text", "is required when reference_wav is given")
    wav = None if reference_wav is None else check_reference_wav(reference_wav, limits)
    text = "" if reference_text is None else check_text(reference_text, "reference_text", limits)
    instruct = "" if instruct_text is None else check_text(instruct_text, "instruct_text", limits)
    return CosyVoice2Request(
        wav, text, check_text(target_text, "target_text", limits), tokens, mode, instruct, profile
    )
