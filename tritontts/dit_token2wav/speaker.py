"""A prepared Step-Audio-2 reference voice, and the speech-token checks every DiT token2wav call makes.

A speaker holds the prompt tokens and mel, cut to n = min(mel_frames // 2, tokens) tokens and 2n frames, the
CAMPPlus x-vector, and the flow's caches after the prompt (`setup_cache` over the n prompt tokens followed by
the prompt's first `pre_lookahead_len` tokens as look-ahead, as upstream does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tritontts.cosyvoice2.frontend import align_prompt_lengths
from tritontts.dit_token2wav.flow import DiTFlow, FlowCache


@dataclass(frozen=True)
class DiTSpeaker:
    """A prepared reference voice; shared by every request that uses it, never modified."""

    key: str
    prompt_tokens: Tensor
    """int64 [1, n] on the flow's device"""
    prompt_mel: Tensor
    """[1, 2n, 80] in the flow's dtype"""
    embedding: Tensor
    """fp32 [1, 192] CAMPPlus x-vector"""
    cache: FlowCache
    """the flow's caches after the prompt"""

    @property
    def prompt_frames(self) -> int:
        return self.prompt_mel.shape[1]


def speech_token_ids(
    tokens: list[int] | np.ndarray | Tensor, vocab_size: int, device: torch.device, name: str = "tokens"
) -> Tensor:
    """`tokens` ([n] or [1, n]) as int64 [1, n] on `device`; a ValueError naming `name` when they are not
    integer speech token ids in [0, vocab_size)."""
    ids = torch.as_tensor(np.asarray(tokens) if not isinstance(tokens, Tensor) else tokens)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} must be a 1-D sequence of speech token ids, got shape {tuple(ids.shape)}")
    if ids.numel() and (ids.dtype.is_floating_point or ids.dtype == torch.bool):
        raise ValueError(f"{name} must be integers, got {ids.dtype}")
    bad = ids[(ids < 0) | (ids >= vocab_size)] if ids.numel() else ids
    if bad.numel():
        raise ValueError(f"{name}: speech token id {int(bad[0])} is outside [0, {vocab_size})")
    return ids.to(device, torch.long).unsqueeze(0)


def speaker_from_features(
    flow: DiTFlow, prompt_tokens: np.ndarray, prompt_mel: np.ndarray, embedding: np.ndarray, key: str = ""
) -> DiTSpeaker:
    """A speaker from its front-end outputs: tokens [n], mel [F, 80] at 24 kHz, x-vector [192]."""
    tokens, mel = align_prompt_lengths(np.asarray(prompt_tokens), np.asarray(prompt_mel, dtype=np.float32))
    if len(tokens) == 0:
        raise ValueError("the reference audio gives no prompt token (too short)")
    ids = speech_token_ids(tokens, flow.config.vocab_size, flow.device, "prompt tokens")
    lookahead = ids[:, torch.arange(flow.config.pre_lookahead_len, device=flow.device) % ids.shape[1]]
    mel_t = torch.from_numpy(mel)[None].to(flow.device, flow.dtype)
    vector = torch.as_tensor(np.asarray(embedding, dtype=np.float32)).reshape(1, -1).to(flow.device)
    cache = flow.setup_cache(torch.cat([ids, lookahead], dim=1), mel_t, vector)
    return DiTSpeaker(key, ids, mel_t, vector, cache)
