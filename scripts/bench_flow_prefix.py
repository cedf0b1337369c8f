"""Flow decoder of a first streamed chunk: the whole call (prompt + chunk) against the frames after a prompt
prefix of whole chunks (flow-prefix-cache branch), fp16 on one GPU, eager and CUDA-graphed, batch 1."""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, "scripts")
from bench_flow_graphs import write_token2wav  # noqa: E402

from tritontts.cosyvoice2.flow import load_flow  # noqa: E402

out = {}
tmp = Path(tempfile.mkdtemp())
DEV = os.environ.get("DEVICE", "cuda")
write_token2wav(tmp, os.environ.get("PRESET", "full"))
flow = load_flow(tmp, device=DEV, dtype=torch.float16 if DEV == "cuda" else torch.float32)
steps = flow.config.cfm.n_timesteps
gen = torch.Generator().manual_seed(0)


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    sync()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return round(ts[len(ts) // 2], 2)


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


with torch.inference_mode():
    for prompt_tokens in (75, 250):
        c = flow.conditions(
            torch.randint(0, 6561, (1, 28), generator=gen, dtype=torch.int32),
            torch.tensor([28], dtype=torch.int32),
            torch.randint(0, 6561, (1, prompt_tokens), generator=gen, dtype=torch.int32),
            torch.tensor([prompt_tokens], dtype=torch.int32),
            torch.randn(1, 2 * prompt_tokens, 80, generator=gen),
            torch.randn(1, 192, generator=gen),
            streaming=True,
            finalize=False,
        )
        frames = c.mu.size(2)
        start = 50 * ((prompt_tokens - 3) // 25)
        mask = torch.ones_like(c.mu[:, :1])
        full = lambda: flow.decoder(c.mu, mask, c.spks, c.cond, steps, streaming=True)
        _, prefixes = flow.decoder.solve_after(
            None, c.mu[:, :, :start], c.spks, c.cond[:, :, :start], steps, keep=start
        )
        after = lambda: flow.decoder.solve_after(
            prefixes, c.mu[:, :, start:], c.spks, c.cond[:, :, start:], steps
        )[0]
        diff = (after() - full()[:, :, start:]).abs().max().item()
        row = {
            "prompt_tokens": prompt_tokens,
            "frames": frames,
            "prefix_frames": start,
            "prefix_bytes": sum(p.nbytes() for p in prefixes),
            "max_abs_diff_fp16": diff,
            "full_eager_ms": timed(full),
            "after_prefix_eager_ms": timed(after),
        }
        if DEV == "cuda":
            row["full_graphed_ms"] = timed(graphed(full))
            row["after_prefix_graphed_ms"] = timed(graphed(after))
        for batch in (8, 16):
            mu, spks, cond = (t.expand(batch, *t.shape[1:]).contiguous() for t in (c.mu, c.spks, c.cond))
            maskb = torch.ones_like(mu[:, :1])
            fullb = lambda: flow.decoder(mu, maskb, spks, cond, steps, streaming=True)
            _, pb = flow.decoder.solve_after(
                None, mu[:, :, :start], spks, cond[:, :, :start], steps, keep=start
            )
            afterb = lambda: flow.decoder.solve_after(pb, mu[:, :, start:], spks, cond[:, :, start:], steps)[
                0
            ]
            row[f"b{batch}_full_eager_ms"] = timed(fullb, 10)
            row[f"b{batch}_after_prefix_eager_ms"] = timed(afterb, 10)
            row[f"b{batch}_prefix_bytes"] = sum(p.nbytes() for p in pb)
            if DEV == "cuda":
                row[f"b{batch}_full_graphed_ms"] = timed(graphed(fullb), 10)
                row[f"b{batch}_after_prefix_graphed_ms"] = timed(graphed(afterb), 10)
            del pb
        print(row, flush=True)
        out[str(prompt_tokens)] = row
        del prefixes
json.dump(out, open(sys.argv[1], "w"), indent=1)
