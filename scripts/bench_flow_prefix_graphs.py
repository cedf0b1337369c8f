"""First streamed chunks of one voice through the CosyVoice2 flow decoder, full-size synthetic weights, fp16 on
one GPU: `flow.decode` from its CUDA graphs (batch sizes 1, 2, 4, 8) against `decode_after_voices` through
`GraphedPrefixCFM` (the voice's prefix made beforehand), both uncompiled; medians, the largest difference, the
graphs' capture. One row: `decode_after_voices` decodes it whole since the H100 run of this benchmark (its prefix
graph was 4-6% slower there), so that row compares the whole path with itself."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from tritontts.bench.offline_timing import median_ms
from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.cosyvoice2.flow.prefix_graphs import GraphedPrefixCFM
from tritontts.cosyvoice2.flow.voice_decode import decode_after_voices
from tritontts.cosyvoice2.flow.voice_prefixes import VoicePrefixes
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.synthetic.cosyvoice2_flow import write_cosyvoice2_yaml, write_flow

PROMPTS = (75, 250)
ROWS = (1, 8, 16)
CHUNK_TOKENS = 28
PREFIX_FRAMES = (100, 200, 300, 400)


def first_chunks(flow: Flow, prompt_tokens: int, rows: int) -> list:
    gen = torch.Generator().manual_seed(prompt_tokens)
    prompt = torch.randint(0, 6561, (1, prompt_tokens), generator=gen, dtype=torch.int32)
    feat = torch.randn(1, 2 * prompt_tokens, 80, generator=gen)
    embedding = torch.randn(1, 192, generator=gen)
    return [
        flow.conditions(
            torch.randint(0, 6561, (1, CHUNK_TOKENS), generator=gen, dtype=torch.int32),
            torch.tensor([CHUNK_TOKENS], dtype=torch.int32),
            prompt,
            torch.tensor([prompt_tokens], dtype=torch.int32),
            feat,
            embedding,
            streaming=True,
            finalize=False,
        )
        for _ in range(rows)
    ]


def main(out: Path) -> None:
    folder = Path(tempfile.mkdtemp())
    write_cosyvoice2_yaml(folder, "full")
    write_flow(folder, "full", seed=0)
    flow = load_flow(folder, device="cuda", dtype=torch.float16)
    config = FlowGraphConfig(batch_sizes=(1, 2, 4, 8), streaming=(True,), memory_limit_mib=8192)
    whole = flow.use_cuda_graphs(config)
    prefix_config = replace(config, buckets=(128, 192, 256), batch_sizes=(1, 2, 4, 8, 16))
    graphed = GraphedPrefixCFM(flow.decoder, flow.config.cfm.n_timesteps, prefix_config, PREFIX_FRAMES)
    captured = graphed.capture()
    report = {
        "meta": {
            "device": torch.cuda.get_device_name(),
            "torch": torch.__version__,
            "whole_graphs": vars(whole) | {"skipped": len(whole.skipped)},
            "prefix_graphs": vars(captured) | {"skipped": len(captured.skipped)},
        },
        "rows": [],
    }
    with torch.inference_mode():
        for prompt_tokens in PROMPTS:
            for rows in ROWS:
                calls = first_chunks(flow, prompt_tokens, rows)
                voices = [("voice", prompt_tokens)] * rows
                store = VoicePrefixes(budget_bytes=16 << 30)
                made = time.perf_counter()
                after = decode_after_voices(flow, calls, voices, store, graphed)
                torch.cuda.synchronize()
                made_ms = (time.perf_counter() - made) * 1000
                whole_mels = flow.decode(calls)
                graphed.calls.update(graph=0, padded=0)
                row = {
                    "prompt_tokens": prompt_tokens,
                    "rows": rows,
                    "max_abs_diff": max((a - w).abs().max().item() for a, w in zip(after, whole_mels)),
                    "first_call_with_prefix_made_ms": round(made_ms, 1),
                    "prefix_bytes": store.nbytes,
                    "whole_graphed_ms": round(median_ms(lambda calls=calls: flow.decode(calls), 10), 2),
                    "after_prefix_graphed_ms": median_ms(
                        lambda calls=calls, voices=voices, store=store: decode_after_voices(
                            flow, calls, voices, store, graphed
                        ),
                        10,
                    ),
                    "prefix_calls": dict(graphed.calls),
                }
                print(row, flush=True)
                report["rows"].append(row)
    out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output", type=Path, help="the JSON to write")
    main(parser.parse_args().output)
