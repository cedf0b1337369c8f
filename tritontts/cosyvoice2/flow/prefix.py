"""The estimator's state after the leading frames of a call, so a later call over the frames after them runs only
on those frames.

In streaming mode the estimator is causal at chunk granularity: causal convolutions, and attention that reaches no
further than the end of the query's own chunk. So for a prefix of whole chunks, every layer's output on the prefix
is the same whatever follows it, and a call over the frames after it needs of the prefix only each causal
convolution's last `kernel - 1` inputs and each attention's keys and values (`LayerPrefix`). `PrefixRun` threads
one such prefix through one estimator forward: it reads the prefix where there is one and records the state after
the call's own frames where asked to."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from tritontts.conv_gemm import CausalConv1d


@dataclass
class LayerPrefix:
    """One estimator call's state after its first `frames` frames, in the order its layers run: each causal
    convolution's last inputs [B, C, kernel - 1], each attention's keys and values [B, heads, frames, head_dim]."""

    frames: int
    convs: list[Tensor] = field(default_factory=list)
    keys: list[Tensor] = field(default_factory=list)
    values: list[Tensor] = field(default_factory=list)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.convs, *self.keys, *self.values))


class PrefixRun:
    """One estimator forward over the frames after `prefix` (None: from frame 0). With `keep`, it also records
    the state after the prefix and this call's first `keep` frames (a whole number of chunks from frame 0)."""

    def __init__(self, prefix: LayerPrefix | None, keep: int | None = None) -> None:
        self.prefix = prefix
        self.keep = keep
        self.offset = 0 if prefix is None else prefix.frames
        self._conv = 0
        self._attention = 0
        self._recorded = LayerPrefix(self.offset + (keep or 0))

    def conv(self, conv: CausalConv1d, x: Tensor) -> Tensor:
        """`conv(x)` with the prefix's last inputs of this convolution as its history (zeros without a prefix)."""
        if self.prefix is None:
            history = x.new_zeros(x.size(0), x.size(1), conv.causal_padding)
        else:
            history = spread(self.prefix.convs[self._conv], x.size(0))
        self._conv += 1
        if self.keep is not None:
            window = torch.cat([history, x[:, :, : self.keep]], dim=2)
            self._recorded.convs.append(window[:, :, window.size(2) - conv.causal_padding :])
        return conv.over_history(conv.after_history(history, x))

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """This call's keys and values [B, heads, T, d] after the prefix's: what its queries attend to."""
        if self.prefix is not None:
            k = after(self.prefix.keys[self._attention], k)
            v = after(self.prefix.values[self._attention], v)
        self._attention += 1
        if self.keep is not None:
            self._recorded.keys.append(k[:, :, : self._recorded.frames])
            self._recorded.values.append(v[:, :, : self._recorded.frames])
        return k, v

    def recorded(self) -> LayerPrefix:
        if self.keep is None:
            raise RuntimeError("this run records nothing: give it keep")
        return self._recorded


def spread(pair: Tensor, rows: int) -> Tensor:
    """A prefix tensor of one voice's CFG pair [2, ...] (conditioned, unconditioned) for `rows` rows of the
    estimator's batch (the conditioned half first, as `CausalCFM.guided_inputs` orders them); others as they are."""
    if pair.size(0) == rows:
        return pair
    half = rows // 2
    return torch.cat([pair[:1].expand(half, *pair.shape[1:]), pair[1:].expand(half, *pair.shape[1:])])


def after(prefix: Tensor, new: Tensor) -> Tensor:
    """prefix [2 or B, heads, S, d] then new [B, heads, T, d] on time, with one copy of the prefix per row written
    straight into the result."""
    if prefix.size(0) == new.size(0):
        return torch.cat([prefix, new], dim=2)
    out = new.new_empty(new.size(0), new.size(1), prefix.size(2) + new.size(2), new.size(3))
    half = new.size(0) // 2
    out[:half, :, : prefix.size(2)] = prefix[:1]
    out[half:, :, : prefix.size(2)] = prefix[1:]
    out[:, :, prefix.size(2) :] = new
    return out


def chunk_mask_after(prefix_frames: int, frames: int, chunk_size: int, valid: Tensor) -> Tensor:
    """[B, 1, frames, prefix_frames + frames] boolean: query prefix_frames + i sees every key before the end of
    its own chunk that is valid (`valid` [B, 1, frames] for this call's frames; the prefix's are all valid)."""
    positions = torch.arange(prefix_frames, prefix_frames + frames, device=valid.device)
    keys = torch.arange(prefix_frames + frames, device=valid.device)
    chunk_end = (torch.div(positions, chunk_size, rounding_mode="floor") + 1) * chunk_size
    sees = keys.unsqueeze(0) < chunk_end.unsqueeze(1)
    key_valid = F.pad(valid, (prefix_frames, 0), value=True)
    return (sees.unsqueeze(0) & key_valid).unsqueeze(1)
