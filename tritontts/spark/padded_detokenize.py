"""BiCodec's detokenize for many items of different lengths in a few padded passes, each item exact.

Every layer between the tokens and the audio is per frame except the convolutions. A convolution's input is
zeroed past each item's end (forward pre-hooks, at that layer's rate), so it sees what the item alone sees: its
zero padding. An item's audio in a padded pass therefore equals its audio alone, up to float rounding.

On CUDA, passes are padded to frame and batch buckets and replayed from CUDA graphs captured per bucket pair
(the vocoder's lengths are a new one per offline request: eager calls would pay cuDNN's plans and a few hundred
launches each time). On the CPU, a pass is padded to its longest item only.

With `compile`, a pass is BiCodec as torch.compile makes it (sizes dynamic; inductor fuses each Snake activation and
frame mask into fewer kernels), and the graphs hold that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from tritontts.cuda_graphs import bucket_for, capture_graph, check_buckets
from tritontts.shape_graphs import Capture, ShapeGraphConfig, ShapeGraphs
from tritontts.spark.bicodec import BiCodec
from tritontts.spark.frame_mask import FrameMask, temporal_convs


@dataclass(frozen=True)
class PaddedPasses:
    frame_buckets: tuple[int, ...] = (50, 100, 150, 200, 250, 300, 350, 400, 500, 600, 800, 1000, 1250, 1500)
    """lengths a pass pads to on CUDA; longer passes pad to a multiple of the largest"""
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16)
    """items a pass pads to on CUDA (rows of length 0); more items take more passes"""
    max_padded_frames: int = 4096
    """a pass's padded frames (items x length) at most, unless one item alone is longer"""
    graphs: ShapeGraphConfig = ShapeGraphConfig(max_graphs=40, min_uses=2, memory_limit_mib=4096)
    warm_frames: int = 400
    """on CUDA, passes up to this length are captured for every batch bucket at load (0: none)"""

    def __post_init__(self) -> None:
        check_buckets("frame_buckets", self.frame_buckets)
        check_buckets("batch_buckets", self.batch_buckets)
        if self.max_padded_frames < self.frame_buckets[-1]:
            raise ValueError("max_padded_frames must hold the largest frame bucket")

    def frames_for(self, length: int) -> int:
        largest = self.frame_buckets[-1]
        return bucket_for(self.frame_buckets, length) or -(-length // largest) * largest

    def batch_for(self, items: int) -> int:
        return bucket_for(self.batch_buckets, items) or items


class PaddedDetokenizer:
    """`detokenize(global_tokens, semantic_tokens)` → each item's audio, computed in padded passes."""

    def __init__(
        self,
        bicodec: BiCodec,
        passes: PaddedPasses | None = None,
        bucketed: bool | None = None,
        cuda_graphs: bool = True,
        capture: Capture | None = None,
        compile: bool = False,
    ) -> None:
        """`bucketed` (default: on CUDA) pads passes to the buckets; CUDA graphs need it and a CUDA model, unless
        `capture` stands in for CUDA graph capture (tests). `compile`: passes run compiled by torch.compile."""
        self.bicodec = bicodec
        self.passes = passes or PaddedPasses()
        self.device = bicodec.quantizer.codebook.weight.device
        self.bucketed = self.device.type == "cuda" if bucketed is None else bucketed
        self.mask = FrameMask(temporal_convs(bicodec.prenet) + temporal_convs(bicodec.decoder))
        self.run_pass = torch.compile(self._pass, dynamic=True) if compile else self._pass
        graphs = self.bucketed and cuda_graphs and (self.device.type == "cuda" or capture is not None)
        self.graphs = (
            ShapeGraphs(
                self.run_pass, self.device, self.passes.graphs, "BiCodec detokenize", capture or capture_graph
            )
            if graphs
            else None
        )

    def _pass(self, global_tokens: Tensor, semantic_tokens: Tensor, lengths: Tensor) -> Tensor:
        """One padded pass; called under `detokenize`'s inference mode (torch.compile traces it there too)."""
        bicodec = self.bicodec
        speaker = bicodec.speaker_vector(global_tokens)
        latents = bicodec.quantizer.detokenize(semantic_tokens)
        with self.mask.active(lengths, semantic_tokens.shape[1]):
            x = bicodec.prenet(latents, speaker) + speaker.unsqueeze(-1)
            return bicodec.decoder(x)[:, 0]

    def plan(self, lengths: Sequence[int]) -> list[list[int]]:
        """Item indices per pass, longest first: as many as the batch buckets and padded frames allow, of one
        frame bucket when bucketed (else padded to the pass's longest)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        passes: list[list[int]] = []
        for index in order:
            current = passes[-1] if passes else None
            if current is not None and len(current) < self.passes.batch_buckets[-1]:
                frames = self._frames(lengths[current[0]])
                same = not self.bucketed or self._frames(lengths[index]) == frames
                if same and self._batch(len(current) + 1) * frames <= self.passes.max_padded_frames:
                    current.append(index)
                    continue
            passes.append([index])
        return passes

    def _frames(self, length: int) -> int:
        return self.passes.frames_for(length) if self.bucketed else length

    def _batch(self, items: int) -> int:
        return self.passes.batch_for(items) if self.bucketed else items

    @torch.inference_mode()
    def detokenize(
        self, global_tokens: Sequence[np.ndarray], semantic_tokens: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        lengths = [len(s) for s in semantic_tokens]
        audios: list[np.ndarray | None] = [None] * len(lengths)
        hop = self.bicodec.hop_length
        for items in self.plan(lengths):
            frames, rows = self._frames(lengths[items[0]]), self._batch(len(items))
            g = np.zeros((rows, len(global_tokens[items[0]])), dtype=np.int64)
            s = np.zeros((rows, frames), dtype=np.int64)
            n = np.zeros(rows, dtype=np.int64)
            for row, index in enumerate(items):
                g[row], s[row, : lengths[index]], n[row] = (
                    global_tokens[index],
                    semantic_tokens[index],
                    lengths[index],
                )
            tensors = [torch.from_numpy(a).to(self.device) for a in (g, s, n)]
            call = self.graphs if self.graphs is not None else self.run_pass
            audio = call(*tensors).float().cpu().numpy()
            for row, index in enumerate(items):
                audios[index] = audio[row, : lengths[index] * hop]
        return audios

    def warm(self) -> int:
        """Capture the passes up to `warm_frames` for every batch bucket (CUDA only); returns how many."""
        if self.graphs is None:
            return 0
        count = 0
        for frames in (f for f in self.passes.frame_buckets if f <= self.passes.warm_frames):
            for rows in self.passes.batch_buckets:
                if rows * frames > self.passes.max_padded_frames:
                    continue
                g = [np.zeros(self.bicodec.config.speaker_encoder.token_num, dtype=np.int64)] * rows
                s = [np.zeros(frames, dtype=np.int64)] * rows
                for _ in range(self.passes.graphs.min_uses):
                    self.detokenize(g, s)
                count += 1
        return count
