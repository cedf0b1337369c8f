"""The flow's encoder replayed from CUDA graphs captured at load, one per (streaming, padded token count).

The encoder's length is the prompt's tokens plus the target's so far, new for every voice and chunk, so graphs
keyed by exact lengths were captured on the request path (an eager call, then a capture) for each voice on each
instance. Here a call pads its token embeddings with zero rows to the smallest bucket that holds them and
`encode_padded` masks the padding out of every valid frame (zero rows after the look-ahead, key masks in the
attention, causal convolutions after it), so every bucket is captured once, when the model loads. Calls longer
than the largest bucket, and CPU models, run the same padded function eagerly or the plain encoder.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tritontts.cuda_graphs import CaptureReport, bucket_for, capture_graph, capture_within_limit

EncodePadded = Callable[[Tensor, Tensor, Tensor, bool], Tensor]
"""(x [1, L, C] zero past `rows`, rows [1], out_tokens [1], streaming) → [1, ratio * L, D]"""


@dataclass
class _Graph:
    graph: object
    x: Tensor
    rows: Tensor
    out_tokens: Tensor
    out: Tensor


class BucketedEncoder:
    """`encoder(x, out_tokens, streaming)`: the encoder's output for the first `out_tokens` of `x` (the rest
    of `x` is their look-ahead), from a captured graph, or None where no bucket holds `x`."""

    def __init__(
        self,
        encode_padded: EncodePadded,
        buckets: Sequence[int],
        width: int,
        token_mel_ratio: int,
        device: torch.device,
        dtype: torch.dtype,
        capture: Callable = capture_graph,
    ) -> None:
        self.encode_padded = encode_padded
        self.buckets = tuple(buckets)
        self.width, self.ratio = width, token_mel_ratio
        self.device, self.dtype = device, dtype
        self._capture = capture
        self._graphs: dict[tuple[bool, int], _Graph] = {}
        self.calls = {"graph": 0, "uncaptured": 0}

    @property
    def keys(self) -> list[tuple[bool, int]]:
        return sorted(self._graphs)

    def _record(self, streaming: bool, tokens: int, pool: tuple) -> None:
        x = torch.zeros(1, tokens, self.width, device=self.device, dtype=self.dtype)
        rows = torch.full((1,), tokens, device=self.device, dtype=torch.long)
        out_tokens = rows.clone()
        graph, out = self._capture(
            lambda: self.encode_padded(x, rows, out_tokens, streaming), self.device, pool
        )
        self._graphs[(streaming, tokens)] = _Graph(graph, x, rows, out_tokens, out)

    @torch.inference_mode()
    def capture(self, memory_limit_mib: int, streaming: Sequence[bool] = (False, True)) -> CaptureReport:
        keys = [(s, tokens) for tokens in self.buckets for s in streaming]
        return capture_within_limit(
            keys, lambda key, pool: self._record(*key, pool), self.device, memory_limit_mib, "flow encoder"
        )

    def capture_on_cpu(self, streaming: Sequence[bool] = (False, True)) -> None:
        """Every bucket with `capture` (a stand-in that replays on the CPU, for tests)."""
        for tokens in self.buckets:
            for s in streaming:
                self._record(s, tokens, ())

    def __call__(self, x: Tensor, out_tokens: int, streaming: bool) -> Tensor | None:
        rows = x.size(1)
        bucket = bucket_for(self.buckets, rows)
        g = None if bucket is None else self._graphs.get((streaming, bucket))
        if g is None:
            self.calls["uncaptured"] += 1
            return None
        self.calls["graph"] += 1
        g.x.copy_(F.pad(x.to(self.dtype), (0, 0, 0, bucket - rows)))
        g.rows.fill_(rows)
        g.out_tokens.fill_(out_tokens)
        g.graph.replay()
        return g.out[:, : self.ratio * out_tokens].clone()
