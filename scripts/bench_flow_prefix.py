"""The CosyVoice2 flow decoder of a first streamed chunk (28 tokens, finalize false) after a prompt of 75 or 250
tokens, full-size synthetic weights, fp16 on one GPU: the whole call against the frames after the prompt's stable
whole chunks (their prefix made beforehand), eager and CUDA-graphed by this script, 1, 8 and 16 rows of the same
call; medians."""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from tritontts.bench.offline_timing import median_ms
from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.synthetic.cosyvoice2_flow import write_cosyvoice2_yaml, write_flow

PROMPTS = (75, 250)
CHUNK_TOKENS = 28


def graphed(run: Callable[[], object]) -> Callable[[], None]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph.replay


def measure(flow: Flow, prompt_tokens: int, rows: int, gen: torch.Generator) -> dict[str, float]:
    steps = flow.config.cfm.n_timesteps
    c = flow.conditions(
        torch.randint(0, 6561, (1, CHUNK_TOKENS), generator=gen, dtype=torch.int32),
        torch.tensor([CHUNK_TOKENS], dtype=torch.int32),
        torch.randint(0, 6561, (1, prompt_tokens), generator=gen, dtype=torch.int32),
        torch.tensor([prompt_tokens], dtype=torch.int32),
        torch.randn(1, 2 * prompt_tokens, 80, generator=gen),
        torch.randn(1, 192, generator=gen),
        streaming=True,
        finalize=False,
    )
    mu, spks, cond = (t.expand(rows, *t.shape[1:]).contiguous() for t in (c.mu, c.spks, c.cond))
    mask = torch.ones_like(mu[:, :1])
    start = 50 * ((prompt_tokens - 3) // 25)
    _, prefixes = flow.decoder.solve_after(
        None, mu[:, :, :start], spks, cond[:, :, :start], steps, keep=start
    )

    def whole() -> torch.Tensor:
        return flow.decoder(mu, mask, spks, cond, steps, streaming=True)

    def after() -> torch.Tensor:
        return flow.decoder.solve_after(prefixes, mu[:, :, start:], spks, cond[:, :, start:], steps)[0]

    reps = 20 if rows == 1 else 10
    return {
        "prompt_tokens": prompt_tokens,
        "rows": rows,
        "frames": mu.size(2),
        "prefix_frames": start,
        "prefix_bytes": sum(p.nbytes() for p in prefixes),
        "max_abs_diff_fp16": (after() - whole()[:, :, start:]).abs().max().item(),
        "whole_eager_ms": median_ms(whole, reps),
        "after_prefix_eager_ms": median_ms(after, reps),
        "whole_graphed_ms": median_ms(graphed(whole), reps),
        "after_prefix_graphed_ms": median_ms(graphed(after), reps),
    }


def main(out: Path) -> None:
    folder = Path(tempfile.mkdtemp())
    write_cosyvoice2_yaml(folder, "full")
    write_flow(folder, "full", seed=0)
    flow = load_flow(folder, device="cuda", dtype=torch.float16)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with torch.inference_mode():
        for prompt_tokens in PROMPTS:
            for batch in (1, 8, 16):
                rows.append(measure(flow, prompt_tokens, batch, gen))
                print(rows[-1], flush=True)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output", type=Path, help="the JSON to write")
    main(parser.parse_args().output)
