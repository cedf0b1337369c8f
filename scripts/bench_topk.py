"""Time the sampler's candidate selection (top-k of [B, V] fp32 logits) as a decode graph runs it.

`torch.topk` over the whole vocabulary against `torch.ops.tritontts.top_k` (chunks sorted in parallel, then
their winners) at several chunk sizes, each replayed from a CUDA graph; checks both give the same values.
Writes JSON with the device and the command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import triton

from tritontts.llm import top_k as top_k_module


def replay_us(fn, iters: int = 200) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(1000 * start.elapsed_time(end) / iters)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocab", type=int, default=166000, help="Spark-TTS's LLM vocabulary")
    parser.add_argument("--batch-sizes", default="1,16,64")
    parser.add_argument("--ks", default="50,64,1024")
    parser.add_argument("--chunks", default="256,512,1024,2048,4096")
    parser.add_argument("--warps", default="0", help="num_warps to try (0: the default)")
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
                "torch_topk_us": round(replay_us(lambda x=logits, n=k: x.topk(n, dim=-1)), 2),
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
                    us = replay_us(lambda x=logits, n=k, c=chunk, w=warps: top_k_module.top_k(x, n, 0, c, w))
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
