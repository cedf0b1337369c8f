#!/usr/bin/env python3
"""CosyVoice3's token2wav flow (the DiT flow, `Token2Mel`) eager against CUDA-graphed, in one process.

    python scripts/bench_cosyvoice3_flow_graphs.py [--model-dir DIR] [--out FILE.json] [--reps 20] [--compile]

Without --model-dir it writes the full-size synthetic token2wav of `write_cosyvoice3_token2wav(dir, "full",
seed=0)` (cosyvoice3.yaml, flow.pt, ...) to a temporary folder. Loads it with `Token2Mel.from_model_dir`, capturing
a `FlowGraphConfig` (batch size 1, the default buckets; `--compile`: the estimator compiled by torch.compile inside
the graphs), then measures, each as the median of --reps `Token2Mel.run_many` calls of one `Token2MelCall` after
warm-up, with the same weights and inputs on both paths (a 3 s random prompt: 75 tokens, 150 mel frames, a
192-wide x-vector):

- first_chunk: a stream's first call (15 + 3 look-ahead target tokens, not finalize),
- later_chunk: its call after 100 target tokens (token_offset 100, 25 + 3 look-ahead more, not finalize),
- offline_5s: 125 target tokens, finalize,

how far the graphed mel moves from the eager one, and the CUDA kernels each call launches (`kernels_per_call`).
Eager: the flow's `graphed_decoder` and `encoder_graphs` set to None; graphed: set back. `decoder_calls` and
`encoder_calls` count the graphed path's calls by kind while timing. Needs torch, numpy, pyyaml, safetensors,
soundfile and onnxruntime (the package imports them), with tritontts importable (installed, or PYTHONPATH=. from
the repository). `--device cpu --preset tiny` is a dry check of everything but the capture (the decoder then runs
its padded calls eagerly, the encoder's buckets replay eagerly).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

from tritontts.bench.graph_bench import capture_eagerly, max_diff
from tritontts.bench.kernel_profile import kernels_per_call
from tritontts.bench.offline_timing import device_name, median_ms

PROMPT_TOKENS = 75  # 3 s at 25 tokens/s
FIRST_CHUNK_TOKENS = 15
LATER_OFFSET = 100
LATER_CHUNK_TOKENS = 25
LOOKAHEAD_TOKENS = 3
OFFLINE_TOKENS = 125  # 5 s
SPEECH_VOCAB = 6561


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, help="a CosyVoice3 token2wav folder (cosyvoice3.yaml, flow.pt)"
    )
    parser.add_argument("--preset", choices=("full", "tiny"), default="full", help="without --model-dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="flow dtype; auto: float16 on CUDA, float32 on CPU")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("cosyvoice3_flow_graphs.json"))
    parser.add_argument(
        "--compile",
        action="store_true",
        help="capture the estimator compiled by torch.compile (minutes at load; CUDA only)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (use --device cpu --preset tiny for a dry check)", file=sys.stderr)
        return 1
    if device.type != "cuda" and args.compile:
        parser.error("--compile captures CUDA graphs: it needs --device cuda")

    from tritontts.cosyvoice2.flow.graphs import GraphedCFM
    from tritontts.cosyvoice3.token2mel import Token2Mel
    from tritontts.cosyvoice3.wire import Token2MelCall
    from tritontts.cuda_graphs import FlowGraphConfig
    from tritontts.devices import resolve_flow_dtype
    from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav

    dtype = resolve_flow_dtype(args.dtype, device)
    config = FlowGraphConfig(batch_sizes=(1,), compile=args.compile)  # the default buckets and memory limit
    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:  # the synthetic checkpoint, gone once loaded
        model_dir = args.model_dir or write_cosyvoice3_token2wav(Path(tmp), args.preset, seed=0)
        model = Token2Mel.from_model_dir(model_dir, device, dtype, flow_graphs=config if cuda else None)
    flow = model.flow
    if cuda:
        report = model.graphs
        capture = {
            "graphs": report.graphs,
            "seconds": round(report.seconds, 2),
            "pool_mib": round(report.pool_mib),
            "skipped": [list(k) for k in report.skipped],
        }
    else:  # the graphed path without graphs: the decoder's padded calls and the encoder's buckets, eagerly
        flow.graphed_decoder = GraphedCFM(flow.decoder, flow.config.cfm.n_timesteps, config)
        flow.encoder_graphs = flow.bucketed_encoder(config, capture=capture_eagerly)
        flow.encoder_graphs.capture_on_cpu(config.streaming)
        capture = {"graphs": 0, "note": f"no capture on {device.type}: padded calls run eagerly"}
    graphed, encoder_graphs = flow.graphed_decoder, flow.encoder_graphs
    print("capture", capture, flush=True)

    def use_graphs(on: bool) -> None:
        flow.graphed_decoder = graphed if on else None
        flow.encoder_graphs = encoder_graphs if on else None

    gen = torch.Generator(device=device).manual_seed(1)

    def tokens(n: int) -> torch.Tensor:
        return torch.randint(0, SPEECH_VOCAB, (1, n), device=device, generator=gen, dtype=torch.int32)

    prompt = (
        tokens(PROMPT_TOKENS),
        torch.randn(1, 2 * PROMPT_TOKENS, 80, device=device, generator=gen),
        torch.randn(1, 192, device=device, generator=gen),
    )
    target = tokens(LATER_OFFSET + LATER_CHUNK_TOKENS + LOOKAHEAD_TOKENS)
    offline = tokens(OFFLINE_TOKENS)
    calls = {
        "first_chunk": Token2MelCall(target[:, : FIRST_CHUNK_TOKENS + LOOKAHEAD_TOKENS], *prompt, 0, False),
        "later_chunk": Token2MelCall(target, *prompt, LATER_OFFSET, False),
        "offline_5s": Token2MelCall(offline, *prompt, None, True),
    }

    cases: dict[str, dict] = {}
    for name, call_args in calls.items():

        def call(c: Token2MelCall = call_args) -> torch.Tensor:
            (mel,) = model.run_many([c])
            if isinstance(mel, ValueError):
                raise mel
            return mel

        mels = {}
        case: dict = {}
        for path, on in (("eager", False), ("graphed", True)):
            use_graphs(on)
            mels[path] = call()
            decoder_before, encoder_before = dict(graphed.calls), dict(encoder_graphs.calls)
            case[f"{path}_ms"] = round(median_ms(call, args.reps, device), 2)
            if on:
                case["decoder_calls"] = {k: graphed.calls[k] - decoder_before[k] for k in decoder_before}
                case["encoder_calls"] = {
                    k: encoder_graphs.calls[k] - encoder_before[k] for k in encoder_before
                }
            case[f"{path}_kernels"] = kernels_per_call(call, device)
        case["speedup"] = round(case["eager_ms"] / case["graphed_ms"], 2)
        case["mel_frames"] = mels["eager"].shape[-1]
        case["mel_max_abs_diff"] = max_diff(mels["graphed"], mels["eager"])
        case["mel_abs_max"] = float(mels["eager"].abs().max())
        cases[name] = case
        print(name, {k: v for k, v in case.items() if not k.endswith("_kernels")}, flush=True)
        if cuda and case["decoder_calls"]["graph"] == 0:
            print(f"warning: {name} ran no graph (calls {case['decoder_calls']})", flush=True)
    use_graphs(True)

    result = {
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": str(args.model_dir) if args.model_dir else f"synthetic {args.preset}, seed 0",
        "flow_dtype": str(dtype),
        "reps": args.reps,
        "graph_config": {
            "buckets": list(config.buckets),
            "batch_sizes": list(config.batch_sizes),
            "streaming": list(config.streaming),
            "memory_limit_mib": config.memory_limit_mib,
            "compile": config.compile,
        },
        "capture": capture,
        "cases": cases,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
