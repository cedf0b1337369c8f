#!/usr/bin/env python3
"""The DiT token2wav (Step-Audio-2-mini) with its flow decoder eager against CUDA-graphed, in one process.

    python scripts/bench_dit_flow_graphs.py [--model-dir DIR] [--out FILE.json] [--reps 20]

Without --model-dir it writes the full-size synthetic flow (flow.yaml, flow.pt) and HiFT (hift.pt) of
`write_dit_token2wav(dir, "full", seed=0)` to a temporary folder (not its ONNX front-end stand-ins: the speaker
is made from random prompt features). Captures the default `DiTFlowGraphConfig`, then measures, each as the
median of --reps calls after warm-up, with the same weights and inputs on both paths:

- first_chunk: a fresh stream's first `DiTToken2Wav.stream` call (25 + 3 look-ahead tokens after a 3 s prompt),
- later_chunk: its third call (the estimator cache full: prompt frames + 100),
- offline_5s: `DiTToken2Wav.offline` of 5 s,

and how far the graphed mel (and a chunk's returned caches) moves from the eager one; `decoder_calls` counts
the graphed decoder's calls by path while timing (a chunk's stream set-up included). With `--batch-sizes 1,2,4,8
--streams 4,8` it also times N fresh streams' first chunks in one `DiTToken2Wav.stream_many` (their flows in
batched graphs, as the `token2wav_dit` model runs one execute's calls) against the same N calls one after another,
and how far the batched audio moves from the audio made alone. Needs torch, numpy, pyyaml
safetensors, soundfile and onnxruntime (the package imports them), with tritontts importable (installed, or
PYTHONPATH=. from the repository). `--device cpu --preset tiny` is a dry check of everything but the capture (the decoder then
runs its padded calls eagerly).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tritontts.bench.graph_bench import max_diff
from tritontts.bench.kernel_profile import kernels_per_call
from tritontts.bench.offline_timing import median_ms

PROMPT_TOKENS = 75  # 3 s at 25 tokens/s
CHUNK_TOKENS = 25
LOOKAHEAD_TOKENS = 3
OFFLINE_TOKENS = 125  # 5 s
STREAM = "bench"


def write_flow_and_hift(folder: Path, preset: str) -> Path:
    from tritontts.synthetic.cosyvoice2_hift import write_hift
    from tritontts.synthetic.dit_token2wav import write_flow

    write_flow(folder, preset, seed=0)
    write_hift(folder, preset, seed=0)
    return folder


def batched_first_chunks(t2w, speaker, rng, counts: list[int], reps: int, device: torch.device) -> dict:
    """For each count N: N fresh streams' first chunks in one stream_many against one after another."""
    from tritontts.dit_token2wav.token2wav import DiTStreamCall

    graphed = t2w.flow.graphed_decoder
    rows = {}
    for count in counts:
        calls = [
            DiTStreamCall(
                f"batch-{i}", speaker, rng.integers(0, 6561, CHUNK_TOKENS + LOOKAHEAD_TOKENS), False
            )
            for i in range(count)
        ]

        def reset(calls=calls) -> None:
            for call in calls:
                t2w.cancel(call.request_id)

        def together(calls=calls) -> list:
            return t2w.stream_many(calls)

        def one_by_one(calls=calls) -> list:
            return [t2w.stream_many([call])[0] for call in calls]

        reset()
        before = dict(graphed.calls)
        batched_audio = together()
        calls_together = {k: graphed.calls[k] - before[k] for k in before}
        reset()
        alone_audio = one_by_one()
        reset()
        together_ms = median_ms(together, reps, device, setup=reset)
        one_by_one_ms = median_ms(one_by_one, reps, device, setup=reset)
        reset()
        rows[str(count)] = {
            "together_ms": round(together_ms, 2),
            "one_by_one_ms": round(one_by_one_ms, 2),
            "speedup": round(one_by_one_ms / together_ms, 2),
            "decoder_calls_together": calls_together,
            "audio_max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(batched_audio, alone_audio)),
        }
        print("batched first chunks", count, rows[str(count)], flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a token2wav folder with flow.yaml, flow.pt, hift.pt")
    parser.add_argument("--preset", choices=("full", "tiny"), default="full", help="without --model-dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="flow dtype; auto: float16 on CUDA, float32 on CPU")
    parser.add_argument("--memory-limit-mib", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("dit_flow_graphs.json"))
    parser.add_argument("--batch-sizes", default="1", help="graph batch sizes to capture, e.g. 1,2,4,8")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="the graphs hold the estimator compiled (--token2wav_compile true)",
    )
    parser.add_argument(
        "--streams", default="", help="stream counts whose first chunks run batched, e.g. 4,8"
    )
    parser.add_argument(
        "--qkv",
        choices=("fused", "unfused"),
        default="fused",
        help="unfused: the three q/k/v projections of the checkpoint, as before tritontts.qkv (an A/B in one session)",
    )
    parser.add_argument(
        "--convs",
        choices=("packed", "cudnn"),
        default="packed",
        help="cudnn: cuDNN's convolutions, as before loading packed them (tritontts.conv_gemm; an A/B in one session)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (use --device cpu for a dry check)", file=sys.stderr)
        return 1

    from tritontts.conv_gemm import unpack_convs
    from tritontts.cosyvoice2.hift import HIFT_FILE, load_hift
    from tritontts.devices import resolve_flow_dtype
    from tritontts.dit_token2wav.flow import load_dit_flow
    from tritontts.dit_token2wav.graphs import DiTFlowGraphConfig, GraphedDiTCFM
    from tritontts.dit_token2wav.token2wav import DiTToken2Wav, hift_config_of
    from tritontts.qkv import unfuse_qkv

    dtype = resolve_flow_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:  # the synthetic checkpoint, gone once loaded
        model_dir = args.model_dir or write_flow_and_hift(Path(tmp), args.preset)
        flow = load_dit_flow(model_dir, device, dtype)
        if args.qkv == "unfused":
            unfuse_qkv(flow)
        if args.convs == "cudnn":
            unpack_convs(flow)
        hift = load_hift(model_dir / HIFT_FILE, hift_config_of(model_dir / HIFT_FILE), device)
    t2w = DiTToken2Wav(flow, hift, seed=0)
    steps = flow.config.n_timesteps

    rng = np.random.default_rng(1)
    speaker = t2w.speaker_from_features(
        rng.integers(0, 6561, PROMPT_TOKENS),
        rng.standard_normal((2 * PROMPT_TOKENS, 80)).astype(np.float32),
        rng.standard_normal(192).astype(np.float32),
    )
    target = rng.integers(0, 6561, 3 * CHUNK_TOKENS + LOOKAHEAD_TOKENS)
    chunks = [target[k * CHUNK_TOKENS : (k + 1) * CHUNK_TOKENS + LOOKAHEAD_TOKENS] for k in range(3)]
    offline_tokens = rng.integers(0, 6561, OFFLINE_TOKENS)

    batch_sizes = tuple(sorted({int(b) for b in args.batch_sizes.split(",")}))
    config = DiTFlowGraphConfig(
        memory_limit_mib=args.memory_limit_mib, batch_sizes=batch_sizes, compile=args.compile
    )
    if device.type == "cuda":
        report = flow.use_cuda_graphs(config)
        capture = {
            "graphs": report.graphs,
            "seconds": round(report.seconds, 2),
            "pool_mib": round(report.pool_mib),
            "skipped": [list(k) for k in report.skipped],
        }
    else:
        flow.graphed_decoder = GraphedDiTCFM(flow.decoder, steps, config)
        capture = {"graphs": 0, "note": f"no capture on {device.type}: padded calls run eagerly"}
    graphed = flow.graphed_decoder
    print("capture", capture, flush=True)

    def ids(tokens: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(tokens, device=device, dtype=torch.long)[None]

    embedding = speaker.embedding

    def cache_before(chunk: int):
        """The stream's flow cache before chunk `chunk`, as DiTToken2Wav.stream keeps it (eager)."""
        flow.graphed_decoder = None
        cache = speaker.cache
        for tokens in chunks[:chunk]:
            _, cache = flow.inference_chunk(ids(tokens), embedding, cache)
            cache = cache.trimmed(speaker.prompt_frames, 100)
        return cache

    def open_stream(chunk: int) -> None:
        t2w.cancel(STREAM)
        for tokens in chunks[:chunk]:
            t2w.stream(STREAM, speaker, tokens, finalize=False)

    cases: dict[str, dict] = {}
    for name, chunk in (("first_chunk", 0), ("later_chunk", 2)):
        cache = cache_before(chunk)
        outputs = {}
        for path, decoder in (("eager", None), ("graphed", graphed)):
            flow.graphed_decoder = decoder
            outputs[path] = flow.inference_chunk(ids(chunks[chunk]), embedding, cache)
        (eager_mel, eager_cache), (graph_mel, graph_cache) = outputs["eager"], outputs["graphed"]
        cases[name] = {
            "cache_frames_before": cache.estimator.frames,
            "mel_frames": eager_mel.shape[2],
            "mel_max_abs_diff": max_diff(graph_mel, eager_mel),
            "mel_abs_max": float(eager_mel.abs().max()),
            "cache_att_max_abs_diff": max_diff(graph_cache.estimator.att, eager_cache.estimator.att),
            "cache_cnn_max_abs_diff": max_diff(graph_cache.estimator.cnn, eager_cache.estimator.cnn),
        }

    flow.graphed_decoder = None
    all_tokens = torch.cat([speaker.prompt_tokens, ids(offline_tokens)], dim=1)
    eager_mel = flow.inference(all_tokens, speaker.prompt_mel, embedding)
    flow.graphed_decoder = graphed
    graph_mel = flow.inference(all_tokens, speaker.prompt_mel, embedding)
    cases["offline_5s"] = {
        "mel_frames": eager_mel.shape[2],
        "mel_max_abs_diff": max_diff(graph_mel, eager_mel),
        "mel_abs_max": float(eager_mel.abs().max()),
    }

    timed = {
        "first_chunk": (
            lambda: t2w.stream(STREAM, speaker, chunks[0], finalize=False),
            lambda: open_stream(0),
        ),
        "later_chunk": (
            lambda: t2w.stream(STREAM, speaker, chunks[2], finalize=False),
            lambda: open_stream(2),
        ),
        "offline_5s": (lambda: t2w.offline(offline_tokens, speaker), None),
    }
    for name, (call, setup) in timed.items():
        for path, decoder in (("eager", None), ("graphed", graphed)):
            flow.graphed_decoder = decoder
            before = dict(graphed.calls)
            cases[name][f"{path}_ms"] = round(median_ms(call, args.reps, device, setup=setup), 2)
            if decoder is not None:
                cases[name]["decoder_calls"] = {k: graphed.calls[k] - before[k] for k in before}
            cases[name][f"{path}_kernels"] = kernels_per_call(call, device, setup=setup)
        t2w.cancel(STREAM)
        cases[name]["speedup"] = round(cases[name]["eager_ms"] / cases[name]["graphed_ms"], 2)
        print(name, {k: v for k, v in cases[name].items() if not k.endswith("_kernels")}, flush=True)
        if device.type == "cuda" and cases[name]["decoder_calls"]["graph"] == 0:
            print(f"warning: {name} ran no graph (calls {cases[name]['decoder_calls']})", flush=True)

    flow.graphed_decoder = graphed
    if args.streams:
        cases["batched_first_chunks"] = batched_first_chunks(
            t2w, speaker, rng, [int(n) for n in args.streams.split(",")], args.reps, device
        )

    result = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": str(args.model_dir) if args.model_dir else f"synthetic {args.preset}, seed 0",
        "flow_dtype": str(dtype),
        "qkv": args.qkv,
        "convs": args.convs,
        "reps": args.reps,
        "graph_config": {
            "offline_buckets": list(config.buckets),
            "chunk_buckets": list(config.chunk_buckets),
            "cache_buckets": list(config.cache_buckets),
            "batch_sizes": list(config.batch_sizes),
            "compile": config.compile,
            "memory_limit_mib": config.memory_limit_mib,
        },
        "capture": capture,
        "cases": cases,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
