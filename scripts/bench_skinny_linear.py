#!/usr/bin/env python3
"""A decode step's projections at batch 1-64: cuBLAS (`F.linear`, then SiLU-gating for gate/up) against the skinny
Triton kernel (`tritontts.llm.skinny_linear`) with its default and other block sizes, on one CUDA GPU.

    python scripts/bench_skinny_linear.py [--rows 1,2,4] [--out skinny_linear.json]

Shapes are the full-size Spark-TTS / CosyVoice2 LLM's (Qwen2.5-0.5B: hidden 896, q + 2 kv = 1152, MLP 4864).
Each path is timed as the replay of one CUDA graph holding `--calls` calls (so launches cost what they cost inside
the engine's graphs) that cycle through `--copies` copies of the weight, as the engine's 24 layers do (with one
copy the weight stays in the GPU's L2 cache between calls), median of `--reps` replays, in microseconds per
call; the error is the largest absolute difference from an fp32 product of the same bf16 inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from tritontts.llm.skinny_linear import DOWN_SPLITS, block_n, skinny_linear, skinny_linear_partials

SHAPES = {  # name: (out features, in features, bias, silu_mul)
    "qkv": (1152, 896, True, False),
    "o_proj": (896, 896, False, False),
    "gate_up_silu": (2 * 4864, 896, False, True),
    "down": (896, 4864, False, False),
}


def reference(x, w, b, silu_mul):
    out = F.linear(x.float(), w.float(), None if b is None else b.float())
    if silu_mul:
        gate, up = out.chunk(2, dim=-1)
        return F.silu(gate) * up
    return out


def cublas(x, w, b, silu_mul):
    out = F.linear(x, w, b)
    if silu_mul:
        gate, up = out.chunk(2, dim=-1)
        return F.silu(gate) * up
    return out


def graphed_us(call, calls: int, reps: int) -> float:
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return sorted(times)[len(times) // 2]


def cycling(fn, x, weights, b, silu_mul, *options):
    turn = iter(range(1 << 62))

    def call():
        return fn(x, weights[next(turn) % len(weights)], b, silu_mul, *options)

    return call


def measure(x, weights, b, silu_mul: bool, calls: int, reps: int) -> dict:
    w = weights[0]
    n_out, k = (w.shape[0] // 2 if silu_mul else w.shape[0]), w.shape[1]
    expected = reference(x, w, b, silu_mul)
    row = {
        "rows": x.shape[0],
        "out": n_out,
        "in": k,
        "default_width": block_n(n_out, k, silu_mul, x.shape[0]),
    }
    row["cublas_us"] = round(graphed_us(cycling(cublas, x, weights, b, silu_mul), calls, reps), 2)
    row["cublas_error"] = float((cublas(x, w, b, silu_mul).float() - expected).abs().max())
    row["skinny_error"] = float((skinny_linear(x, w, b, silu_mul).float() - expected).abs().max())
    variants = {"default": round(graphed_us(cycling(skinny_linear, x, weights, b, silu_mul), calls, reps), 2)}
    one_row = x.shape[0] == 1
    if k <= 2048:  # tl.dot (more rows) needs 16 or more features per program
        for width in (1, 2, 4, 8) if one_row else (16, 32):
            for block_k in (256, 512, 1024) if one_row else (64, 128, 256):
                for warps in (4, 8):
                    call = cycling(skinny_linear, x, weights, b, silu_mul, width, block_k, warps)
                    variants[f"w{width}_k{block_k}_n{warps}"] = round(graphed_us(call, calls, reps), 2)
    if (
        one_row and not silu_mul and b is None and k > 2048
    ):  # the down projection: fp32 shares, summed by the next layer
        row["shares_error"] = float((skinny_linear_partials(x, w).sum(0) - expected).abs().max())
        row["shares_default_splits"] = DOWN_SPLITS

        def shares(x_, w_, b_, s_, *options):
            return skinny_linear_partials(x_, w_, *options)

        variants["shares_default"] = round(
            graphed_us(cycling(shares, x, weights, b, silu_mul), calls, reps), 2
        )
        for splits in (4, 5, 8):
            for width in (2, 4):
                for block_k in (512, 1024):
                    for warps in (4, 8):
                        call = cycling(shares, x, weights, b, silu_mul, splits, width, block_k, warps)
                        name = f"shares{splits}_w{width}_k{block_k}_n{warps}"
                        variants[name] = round(graphed_us(call, calls, reps), 2)
    best = min(variants, key=variants.get)
    default = variants["default"]
    return row | {
        "skinny_us": variants,
        "best": best,
        "best_us": variants[best],
        "speedup": round(row["cublas_us"] / default, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--copies", type=int, default=24, help="weight copies the calls cycle through")
    parser.add_argument("--out", type=Path, default=Path("skinny_linear.json"))
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for name, (n, k, has_bias, silu_mul) in SHAPES.items():
        w = (torch.randn(n, k, device="cuda", generator=gen) * k**-0.5).to(torch.bfloat16)
        weights = [w] + [w.clone() for _ in range(args.copies - 1)]
        b = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) if has_bias else None
        for rows in [int(r) for r in args.rows.split(",")]:
            x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
            row = {"shape": name} | measure(x, weights, b, silu_mul, args.calls, args.reps)
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "skinny_us"}), flush=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
