#!/usr/bin/env python3
"""A batch-1 decode step's q/k/v and gate/up projections with the residual add and RMSNorm inside
(`tritontts.llm.norm_linear`) at several widths (output features per program) and warps, against what they
replaced: the add + norm compiled by inductor, then the skinny projection. One CUDA GPU.

    python scripts/bench_norm_linear.py [--out norm_linear.json]

Timing as scripts/bench_skinny_linear.py: the replay of one CUDA graph of `--calls` calls cycling through `--copies`
weight copies, median of `--reps`, in microseconds per call.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from bench_skinny_linear import graphed_us

from tritontts.llm.model import add_delta, rms_norm
from tritontts.llm.norm_linear import norm_linear
from tritontts.llm.skinny_linear import block_n, skinny_linear

HIDDEN, EPS = 896, 1e-6
SHAPES = {  # name: (out features, bias, silu_mul, what is added to the residual)
    "qkv (after the MLP's 4 fp32 shares)": (1152, True, False, "shares"),
    "gate_up_silu (after the attention's output row)": (2 * 4864, False, True, "row"),
}


def measure(name: str, n: int, has_bias: bool, silu_mul: bool, delta_kind: str, args, add_norm) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(n)
    bf16 = torch.bfloat16
    weights = [(torch.randn(n, HIDDEN, device="cuda", generator=gen) * HIDDEN**-0.5).to(bf16)]
    weights += [weights[0].clone() for _ in range(args.copies - 1)]
    b = torch.randn(n, device="cuda", generator=gen).to(bf16) if has_bias else None
    norm_w = (1 + 0.1 * torch.randn(HIDDEN, device="cuda", generator=gen)).to(bf16)
    x = torch.randn(1, HIDDEN, device="cuda", generator=gen).to(bf16)
    if delta_kind == "shares":
        delta = torch.randn(4, 1, HIDDEN, device="cuda", generator=gen)
    else:
        delta = torch.randn(1, 1, HIDDEN, device="cuda", generator=gen).to(bf16)
    turn = iter(range(1 << 62))

    def unfused():
        _, normed = add_norm(x, delta if delta_kind == "shares" else delta[0], norm_w)
        return skinny_linear(normed, weights[next(turn) % len(weights)], b, silu_mul)

    def fused(width=0, warps=4):
        def call():
            weight = weights[next(turn) % len(weights)]
            return norm_linear(x, delta, norm_w, EPS, weight, b, silu_mul, width, warps)

        return call

    difference = (unfused().float() - fused()()[0].float()).abs().max()
    row = {
        "shape": name,
        "default_width": block_n(n // 2 if silu_mul else n, HIDDEN, silu_mul),
        "largest_difference": float(difference),
        "add_norm_then_skinny_us": round(graphed_us(unfused, args.calls, args.reps), 2),
        "fused_us": {"default": round(graphed_us(fused(), args.calls, args.reps), 2)},
    }
    for width in (1, 2, 4, 8):
        for warps in (1, 2, 4, 8):
            us = graphed_us(fused(width, warps), args.calls, args.reps)
            row["fused_us"][f"w{width}_n{warps}"] = round(us, 2)
    row["best"] = min(row["fused_us"], key=row["fused_us"].get)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--copies", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path("norm_linear.json"))
    args = parser.parse_args()
    add_norm = torch.compile(lambda x, d, w: (lambda r: (r, rms_norm(r, w, EPS)))(add_delta(x, d)))
    results = []
    for name, shape in SHAPES.items():
        row = measure(name, *shape, args, add_norm)
        results.append(row)
        summary = {k: v for k, v in row.items() if k != "fused_us"}
        print(json.dumps(summary | {"best_us": row["fused_us"][row["best"]]}), flush=True)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
    }
    args.out.write_text(json.dumps(report | {"results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
