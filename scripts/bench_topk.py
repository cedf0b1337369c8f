"""Time the sampler's candidate selection (top-k of [B, V] fp32 logits) as a decode graph runs it.

`torch.topk` over the whole vocabulary against `torch.ops.tritontts.top_k` (chunks sorted in parallel, then
their winners) at several chunk sizes, each `--calls` times in one CUDA graph (as a decode step's graph holds it, no launch
between); checks both give the same values.
Writes JSON with the device and the command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
from bench_skinny_linear import graphed_us

from tritontts.llm import top_k as top_k_module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=166000, help="Spark-TTS's LLM vocabulary")
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--ks", default="50,64,1024")
    parser.add_argument("--chunks", default="256,512,1024,2048,4096")
    parser.add_argument("--warps", default="0", help="num_warps to try (0: the default)")
    parser.add_argument("--calls", type=int, default=20, help="selections captured in one graph")
    parser.add_argument("--reps", type=int, default=20, help="graph replays timed (median)")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        logits = torch.randn(batch, args.vocab, device="cuda") * 3
        logits[:, ::97] = float("-inf")
        for k in [int(k) for k in args.ks.split(",")]:
            reference = logits.topk(k, dim=-1)
            row = {
                "batch": batch,
                "k": k,
                "torch_topk_us": round(
                    graphed_us(lambda x=logits, n=k: x.topk(n, dim=-1), args.calls, args.reps), 2
                ),
            }
            for chunk in [int(c) for c in args.chunks.split(",")]:
                if 2 * top_k_module.padded_k(k) > chunk:
                    continue
                values, ids = top_k_module.top_k(logits, k, 0, chunk)
                row[f"triton_c{chunk}_launches"] = len(top_k_module.stage_sizes(args.vocab, k, chunk))
                row[f"triton_c{chunk}_same"] = torch.equal(values, reference.values) and torch.equal(
                    logits.gather(1, ids), values
                )
                for warps in [int(w) for w in args.warps.split(",")]:
                    call = lambda x=logits, n=k, c=chunk, w=warps: top_k_module.top_k(x, n, 0, c, w)  # noqa: E731
                    us = graphed_us(call, args.calls, args.reps)
                    row[f"triton_c{chunk}_w{warps}_us"] = round(us, 2)
            print(
                json.dumps(
                    {key: v for key, v in row.items() if not key.endswith(("_same", "_launches")) or not v}
                ),
                flush=True,
            )
            results.append(row)
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "tl_topk": top_k_module.HAS_TOPK,
        "command": "python " + " ".join(sys.argv),
        "results": results,
    }
    if args.output:
        args.output.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
