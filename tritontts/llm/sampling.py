"""Batch-invariant, seeded token sampling on the device, with no host sync (CUDA-graph capturable).

Each row draws its noise from a hash of (seed, step, token id), so a request samples the same tokens
whether it runs alone or next to others. Order of operations follows Hugging Face: repetition penalty,
min-tokens mask of end_id, the request's bad token ids, temperature, top-k, top-p; then the Gumbel-max trick
picks a candidate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
SMALL_TOP_K = 64
"""Candidates a decode step selects when no running request wants more (see ModelRunner.candidates)."""


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for 0 <= x < 2**32, without int64 overflow."""
    low = (x & 0xFFFF) * constant
    high = (((x >> 16) * constant) & 0xFFFF) << 16
    return (low + high) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (lowbias32) on int64 tensors holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seed: torch.Tensor, step: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """fp32 uniform in (0, 1) for seeds `[B]`, steps `[B]` and token ids `[B, K]`."""
    row = mix32((seed & MASK32) ^ mix32(((seed >> 32) + 0x9E3779B9) & MASK32))
    row = mix32(row ^ mix32(step & MASK32))
    bits = mix32(row.unsqueeze(1) ^ mix32(token_ids & MASK32))
    return ((bits >> 8).float() + 0.5) / float(1 << 24)


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF semantics: logits of seen tokens are divided by the penalty when positive, multiplied when not."""
    penalty = penalty.unsqueeze(1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalized, logits)


def mask_end_id(logits: torch.Tensor, end_id: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    vocab = torch.arange(logits.shape[-1], device=logits.device)
    hit = (vocab.unsqueeze(0) == end_id.unsqueeze(1)) & masked.unsqueeze(1)
    return logits.masked_fill(hit, float("-inf"))


def mask_bad_ids(logits: torch.Tensor, bad_ids: torch.Tensor) -> torch.Tensor:
    """-inf at the ids of `bad_ids [B, K]`, in place (`logits` is sampling_logits' own copy); entries < 0 change
    nothing (see SlotState.assign for the padding)."""
    index = bad_ids.clamp(min=0)
    kept = logits.gather(1, index)
    return logits.scatter_(1, index, torch.where(bad_ids >= 0, float("-inf"), kept))


def top_k_top_p_keep(sorted_logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Which of the descending `sorted_logits [B, K]` survive top-k (0 = all K), then top-p among those."""
    candidates = sorted_logits.shape[-1]
    rank = torch.arange(candidates, device=sorted_logits.device).unsqueeze(0)
    limit = torch.where(top_k > 0, top_k.clamp(max=candidates), candidates).unsqueeze(1)
    keep = rank < limit
    probs = torch.softmax(sorted_logits.masked_fill(~keep, float("-inf")), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    return keep & (mass_before < top_p.unsqueeze(1))


@dataclass
class SamplingBatch:
    """Per-row sampling tensors (views of `SamplingState` rows)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    repetition_penalty: torch.Tensor
    seed: torch.Tensor
    end_id: torch.Tensor
    min_tokens: torch.Tensor
    step: torch.Tensor
    seen: torch.Tensor
    bad_ids: torch.Tensor | None = None


def sampling_logits(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """fp32 logits `[B, V]` after the repetition penalty, the min-tokens mask of end_id and the bad ids' mask."""
    logits = apply_repetition_penalty(logits, batch.seen, batch.repetition_penalty)
    logits = mask_end_id(logits, batch.end_id, batch.step < batch.min_tokens)
    return logits if batch.bad_ids is None else mask_bad_ids(logits, batch.bad_ids)


def choose(top_logits: torch.Tensor, top_ids: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Token ids `[B]` from each row's candidates, descending (`topk` of `sampling_logits`; candidates past
    those selected may be -inf: a row's top_k never reaches them). `top_ids` are vocabulary ids: the noise of
    a token depends on its id, not on where the logits start."""
    greedy = (batch.temperature <= 0) | (batch.top_k == 1)
    temperature = torch.where(greedy, torch.ones_like(batch.temperature), batch.temperature)
    scaled = top_logits / temperature.unsqueeze(1)
    keep = top_k_top_p_keep(scaled, batch.top_k, batch.top_p)
    gumbel = -torch.log(-torch.log(uniform_noise(batch.seed, batch.step, top_ids)))
    choice = torch.where(keep, scaled + gumbel, float("-inf")).argmax(dim=-1)
    choice = torch.where(greedy, torch.zeros_like(choice), choice)
    return top_ids.gather(1, choice.unsqueeze(1)).squeeze(1)


def sample(logits: torch.Tensor, batch: SamplingBatch, max_top_k: int, id_offset: int = 0) -> torch.Tensor:
    """Token ids `[B]` from fp32 logits `[B, V]` of vocabulary ids `id_offset..`."""
    logits = sampling_logits(logits, batch)
    top_logits, top_ids = logits.topk(min(max_top_k, logits.shape[-1]), dim=-1)
    return choose(top_logits, top_ids + id_offset if id_offset else top_ids, batch)
