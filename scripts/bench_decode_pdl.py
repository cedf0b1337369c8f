#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) for the chain of small kernels of a batch-1 decode step, on one GPU.

    python scripts/bench_decode_pdl.py [--reps 200] [--rounds 3] [--out decode_pdl.json]

A batch-1 decode step of the full-size Spark-TTS / CosyVoice2 LLM replays about 136 kernels of 2-8 us each from one
CUDA graph; their GPU time (0.635 ms on an H100) is nearly twice what reading the step's weights at the memory's
bandwidth would take. Each kernel starts only once the one before has ended, and its programs first wait for their
weights. With PDL (sm_90 and later) a kernel launched with the programmatic-serialization attribute may start while
the one before it still runs: its programs read their weights, then `griddepcontrol.wait` until the previous
kernel's output is complete before reading it.

This script measures what that is worth before the engine's kernels take it up. It replays a stand-in for the
step's projections, 24 layers of q/k/v (with bias), o, gate/up with SiLU gating and down (split into fp32 shares
that the next layer's q/k/v sums), each layer with its own weights at the full-size shapes (716 MB in all), as
one CUDA graph of 96 launches of one Triton GEMV kernel, in three variants:

- `plain`: launched as the engine launches its kernels;
- `pdl`: launched with PDL, each program reading its weights before the wait;
- `pdl_early`: the same, and each program allows the next kernel to start as it begins
  (`griddepcontrol.launch_dependents`), so the next kernel's programs take free SMs sooner.

Each variant is timed by CUDA events as the median of `--reps` replays, the variants alternating over `--rounds`
rounds, and its output is compared with `plain`'s (the same arithmetic: equal). `--device cpu --preset tiny` runs
the plain chain in Triton's CPU interpreter (TRITON_INTERPRET=1; PDL's instructions do not run there) against the
same chain in torch, without timings.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without griddepcontrol: only the plain chain runs
    gdc_launch_dependents = gdc_wait = None

VARIANTS = {"plain": (False, False), "pdl": (True, False), "pdl_early": (True, True)}
"""name: (launched with PDL, programs allow the next kernel to start as they begin)"""


@dataclass(frozen=True)
class ChainShape:
    hidden: int
    qkv: int
    intermediate: int
    layers: int
    down_shares: int


PRESETS = {
    "full": ChainShape(hidden=896, qkv=1152, intermediate=4864, layers=24, down_shares=8),
    "tiny": ChainShape(hidden=64, qkv=96, intermediate=160, layers=2, down_shares=2),
}


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    n_out,
    k_chunk,
    k_in,
    stride_xs,
    stride_wn,
    stride_os,
    X_SHARES: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU_MUL: tl.constexpr,
    PDL: tl.constexpr,
    EARLY: tl.constexpr,
):
    """out[share, n] = sum over the share's k of w[n, k] * x[k], where x is the sum of X_SHARES fp32 (or one)
    rows; one block of BLOCK_K inputs per program. With PDL the weights are read before the wait."""
    if EARLY:
        gdc_launch_dependents()
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.program_id(1) * k_chunk + tl.arange(0, BLOCK_K)
    n_mask = offs_n < n_out
    k_mask = (offs_k < (tl.program_id(1) + 1) * k_chunk) & (offs_k < k_in)
    w_mask = n_mask[:, None] & k_mask[None, :]
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
    if SILU_MUL:
        u = tl.load(w_ptr + (offs_n + n_out)[:, None] * stride_wn + offs_k[None, :], mask=w_mask, other=0.0)
    if HAS_BIAS:
        b = tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
    x = tl.zeros([BLOCK_K], dtype=tl.float32)
    for share in tl.static_range(X_SHARES):
        x += tl.load(x_ptr + share * stride_xs + offs_k, mask=k_mask, other=0.0).to(tl.float32)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    if HAS_BIAS:
        acc += b
    if SILU_MUL:
        up = tl.sum(u.to(tl.float32) * x[None, :], axis=1)
        acc = acc * tl.sigmoid(acc) * up
    out = out_ptr + tl.program_id(1) * stride_os + offs_n
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


@dataclass
class Projection:
    """One launch of the chain: `x` (its first `k_in` columns, summed over its rows) times `w`, into `out`."""

    x: torch.Tensor  # [shares, >= k_in]
    w: torch.Tensor  # [n_out (x2 with silu_mul), k_in]
    b: torch.Tensor | None
    out: torch.Tensor  # [out_shares, n_out]
    silu_mul: bool
    block_n: int
    num_warps: int

    @property
    def n_out(self) -> int:
        return self.out.shape[1]

    @property
    def k_in(self) -> int:
        return self.w.shape[1]

    def launch(self, pdl: bool, early: bool) -> None:
        shares = self.out.shape[0]
        k_chunk = triton.cdiv(self.k_in, shares)
        grid = (triton.cdiv(self.n_out, self.block_n), shares)
        options = {"launch_pdl": True} if pdl else {}
        _gemv_kernel[grid](
            self.x,
            self.w,
            self.w if self.b is None else self.b,
            self.out,
            self.n_out,
            k_chunk,
            self.k_in,
            self.x.stride(0),
            self.w.stride(0),
            self.out.stride(0),
            X_SHARES=self.x.shape[0],
            BLOCK_N=self.block_n,
            BLOCK_K=triton.next_power_of_2(k_chunk),
            HAS_BIAS=self.b is not None,
            SILU_MUL=self.silu_mul,
            PDL=pdl,
            EARLY=early,
            num_warps=self.num_warps,
            **options,
        )

    def reference(self) -> torch.Tensor:
        x = self.x[:, : self.k_in].float().sum(0)
        out = F.linear(x, self.w.float(), None if self.b is None else self.b.float())
        if self.silu_mul:
            gate, up = out.chunk(2)
            out = F.silu(gate) * up
        return out


def build_chain(shape: ChainShape, device: torch.device, dtype: torch.dtype) -> list[Projection]:
    """The 4 projections of each layer, each layer with its own weights; layer l's q/k/v reads layer l-1's
    down shares (the first reads a bf16 input row), o reads q/k/v's first `hidden` outputs."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def weight(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) * cols**-0.5).to(device, dtype)

    h, chain = shape.hidden, []
    x = torch.randn(1, h, generator=gen).to(device, dtype)
    for _ in range(shape.layers):
        qkv = torch.empty(1, shape.qkv, device=device, dtype=dtype)
        o = torch.empty(1, h, device=device, dtype=dtype)
        gate_up = torch.empty(1, shape.intermediate, device=device, dtype=dtype)
        down = torch.empty(shape.down_shares, h, device=device, dtype=torch.float32)
        bias = (torch.randn(shape.qkv, generator=gen) * 0.1).to(device, dtype)
        chain += [
            Projection(x, weight(shape.qkv, h), bias, qkv, False, block_n=4, num_warps=4),
            Projection(qkv, weight(h, h), None, o, False, block_n=4, num_warps=2),
            Projection(o, weight(2 * shape.intermediate, h), None, gate_up, True, block_n=2, num_warps=4),
            Projection(gate_up, weight(h, shape.intermediate), None, down, False, block_n=4, num_warps=2),
        ]
        x = down
    return chain


def run_chain(chain: list[Projection], pdl: bool, early: bool) -> None:
    for projection in chain:
        projection.launch(pdl, early)


def torch_chain_error(chain: list[Projection]) -> float:
    """The largest difference between each kernel's output and torch's product of the same inputs, relative to
    the output's largest magnitude (the chain was run just before)."""
    worst = 0.0
    for projection in chain:
        got = projection.out.float().sum(0)
        want = projection.reference()
        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp(min=1e-6)))
    return worst


def graph_of(chain: list[Projection], pdl: bool, early: bool) -> torch.cuda.CUDAGraph:
    for _ in range(3):
        run_chain(chain, pdl, early)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_chain(chain, pdl, early)
    return graph


def replay_us(graph: torch.cuda.CUDAGraph, reps: int) -> float:
    for _ in range(10):
        graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def time_variants(chain: list[Projection], reps: int, rounds: int) -> dict:
    graphs, failed = {}, {}
    for name, (pdl, early) in VARIANTS.items():
        try:
            graphs[name] = graph_of(chain, pdl, early)
        except (
            Exception
        ) as error:  # a driver or Triton that cannot launch or capture it: say so, time the rest
            failed[name] = f"{type(error).__name__}: {error}"[:500]
            torch.cuda.synchronize()
    outputs = {}
    for name, graph in graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        outputs[name] = chain[-1].out.clone()
    per_round = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            per_round[name].append(round(replay_us(graph, reps), 2))
    weight_bytes = sum(p.w.numel() * p.w.element_size() for p in chain)
    rows: dict = {name: {"error": error} for name, error in failed.items()}
    for name in graphs:
        us = statistics.median(per_round[name])
        rows[name] = {
            "chain_us": us,
            "chain_us_per_round": per_round[name],
            "us_per_launch": round(us / len(chain), 3),
            "weight_tb_per_s": round(weight_bytes / (us * 1e-6) / 1e12, 3),
            "output_equals_plain": bool(torch.equal(outputs[name], outputs["plain"])),
        }
    return {"launches": len(chain), "weight_mb": round(weight_bytes / 1e6, 1), "variants": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("decode_pdl.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        print("error: no CUDA GPU (use --device cpu --preset tiny under TRITON_INTERPRET=1)", file=sys.stderr)
        return 1
    shape = PRESETS[args.preset]
    chain = build_chain(shape, device, torch.bfloat16 if cuda else torch.float32)
    run_chain(chain, False, False)
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or "CPU",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "command": " ".join(sys.argv),
        "shape": asdict(shape),
        "plain_chain_vs_torch_max_rel_error": float(f"{torch_chain_error(chain):.3g}"),
        "timing": None,
    }
    if cuda:
        capability = torch.cuda.get_device_capability(device)
        if gdc_wait is None or capability < (9, 0):
            result["timing"] = (
                f"PDL unavailable: Triton {triton.__version__}, compute capability {capability}"
            )
        else:
            result["timing"] = time_variants(chain, args.reps, args.rounds)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
