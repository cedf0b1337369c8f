#!/usr/bin/env python3
"""CosyVoice2 token2wav with the flow decoder eager against CUDA-graphed, in one process on one GPU.

    python scripts/bench_flow_graphs.py [--model-dir DIR] [--out FILE.json]

Without --model-dir it writes the full-size synthetic token2wav files (cosyvoice2.yaml, flow.pt, hift.pt) to a
temporary folder. Measures, each as the median of --reps calls after warm-up, with the same weights and inputs
on both paths: the decoder alone (batch 1 and 8 streams, each a CFG pair), the first streamed chunk (15 + 3
look-ahead tokens after a 75-token prompt) split into flow encoder, flow decoder and HiFT, and a 5 s offline
call; and how far the graphed mel moves from the eager one (fp16). Then N concurrent streams of 10 s each
(upstream's exponential schedule), advanced in lockstep: each round's chunk calls of all streams go through one
`Token2Wav.run_many`, as one Triton execute takes them; eager runs the decoder per call, graphed batches it. The
first round's time is the first chunk every stream waits for; audio seconds over wall seconds is the throughput.
`--device cpu --preset tiny` is a dry check of everything but the capture: the decoder runs its padded calls
eagerly, the encoder's buckets replay eagerly, HiFT runs eagerly both ways.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from tritontts.bench.graph_bench import capture_eagerly
from tritontts.bench.kernel_profile import kernels_per_call
from tritontts.bench.offline_timing import device_name, median_ms, synchronize
from tritontts.conv_gemm import unpack_convs
from tritontts.cosyvoice2.flow.graphs import GraphedCFM
from tritontts.cosyvoice2.token2wav import StreamSchedule, Token2Wav, Token2WavCall
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig
from tritontts.devices import resolve_flow_dtype
from tritontts.qkv import unfuse_qkv

PROMPT_TOKENS = 75
FIRST_CHUNK_TOKENS = 15 + 3
OFFLINE_TOKENS = 125
STREAM_TOKENS = 250
SAMPLE_RATE = 24000


def write_token2wav(folder: Path, preset: str) -> Path:
    from tritontts.synthetic.cosyvoice2_flow import write_cosyvoice2_yaml, write_flow
    from tritontts.synthetic.cosyvoice2_hift import write_hift

    write_cosyvoice2_yaml(folder, preset)
    write_flow(folder, preset, seed=0)
    write_hift(folder, preset, seed=0)
    return folder


class StageClock:
    """Wraps callables to add their synchronized wall time to a named total."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.ms: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, call: Callable) -> Callable:
        def timed(*args, **kwargs):
            synchronize(self.device)
            start = time.perf_counter()
            out = call(*args, **kwargs)
            synchronize(self.device)
            self.ms[name] += 1000 * (time.perf_counter() - start)
            return out

        return timed


def decoder_inputs(
    batch: int, frames: int, dtype: torch.dtype, device: torch.device, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device=device).manual_seed(seed)
    mu = torch.randn(batch, 80, frames, device=device, generator=gen, dtype=dtype)
    cond = torch.zeros_like(mu)
    cond[:, :, : frames // 2] = torch.randn(batch, 80, frames // 2, device=device, generator=gen, dtype=dtype)
    spks = torch.randn(batch, 80, device=device, generator=gen, dtype=dtype)
    return mu, torch.ones(batch, 1, frames, device=device, dtype=dtype), spks, cond


def encoder_rows(flow, reps: int, device: torch.device) -> list[dict]:
    """The flow encoder of a first chunk (prompt + 15 tokens + 3 look-ahead) eager against its bucket's graph."""
    return [encoder_row(flow, prompt + FIRST_CHUNK_TOKENS, reps, device) for prompt in (75, 249)]


@torch.inference_mode()
def encoder_row(flow, tokens: int, reps: int, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(tokens)
    x = flow.input_embedding(torch.randint(0, 6561, (1, tokens), device=device, generator=gen))
    out_tokens = tokens - flow.pre_lookahead_len
    length = torch.tensor([tokens], device=device)

    def eager_call() -> torch.Tensor:
        return flow.encode(x[:, :out_tokens], length, x[:, out_tokens:], True)

    def graph_call() -> torch.Tensor:
        return flow.encoder_graphs(x, out_tokens, True)

    diff = (graph_call() - eager_call()).abs().max()
    eager, graph = median_ms(eager_call, reps, device), median_ms(graph_call, reps, device)
    row = {
        "rows": tokens,
        "eager_ms": round(eager, 2),
        "graphed_ms": round(graph, 2),
        "max_abs_diff": float(diff),
    }
    print("encoder", row, flush=True)
    return row


def run_streams(t2w: Token2Wav, streams: int, prompt_tokens, prompt_feat, embedding) -> dict:
    """`streams` streams of STREAM_TOKENS tokens in lockstep, each round's calls in one run_many."""
    device = prompt_tokens.device
    gen = torch.Generator(device=device).manual_seed(streams)
    targets = [
        torch.randint(0, 6561, (1, STREAM_TOKENS), device=device, generator=gen, dtype=torch.int32)
        for _ in range(streams)
    ]
    plan = StreamSchedule(exponential=True).plan(STREAM_TOKENS)
    round_ms = []
    samples = 0
    synchronize(device)
    start = time.perf_counter()
    for chunk in plan:
        round_start = time.perf_counter()
        calls = [
            Token2WavCall(
                t[:, : chunk.token_end],
                prompt_tokens,
                prompt_feat,
                embedding,
                f"s{i}",
                chunk.token_offset,
                chunk.finalize,
            )
            for i, t in enumerate(targets)
        ]
        results = t2w.run_many(calls)
        synchronize(device)
        round_ms.append(1000 * (time.perf_counter() - round_start))
        samples += sum(r.shape[-1] for r in results)
    wall = time.perf_counter() - start
    return {
        "first_round_ms": round(round_ms[0], 2),
        "round_ms": [round(ms, 1) for ms in round_ms],
        "audio_s_per_s": round(samples / SAMPLE_RATE / wall, 2),
        "wall_s": round(wall, 3),
    }


def compile_rows(
    t2w: Token2Wav, frames_list: list[int], dtype: torch.dtype, reps: int, dynamic: bool = False
) -> list[dict]:
    """The estimator compiled by torch.compile (inductor) inside the same graphs, against the plain one: a
    streaming batch-1 graph per frame count, the time to compile and capture, and the mel difference. Static:
    one compilation per frame count; dynamic: one compilation with symbolic sizes, captured at every count."""
    cfm, steps = t2w.flow.decoder, t2w.flow.config.cfm.n_timesteps
    plain = cfm.estimator
    groups = [tuple(frames_list)] if dynamic else [(frames,) for frames in frames_list]
    rows = []
    for buckets in groups:
        config = FlowGraphConfig(buckets=tuple(sorted(buckets)), batch_sizes=(1,), streaming=(True,))
        with torch.inference_mode():
            base = GraphedCFM(cfm, steps, config)
            base.capture()
            torch._dynamo.reset()
            cfm.estimator = torch.compile(plain, dynamic=dynamic)
            start = time.perf_counter()
            compiled = GraphedCFM(cfm, steps, config)
            compiled.capture()
            warmup_s = time.perf_counter() - start
            cfm.estimator = plain
            for frames in buckets:
                inputs = decoder_inputs(1, frames, dtype, torch.device("cuda"))
                base_mel = base(*inputs, steps, True).clone()
                base_ms = median_ms(lambda g=base, x=inputs: g(*x, steps, True), reps)
                mel = compiled(*inputs, steps, True)
                compiled_ms = median_ms(lambda g=compiled, x=inputs: g(*x, steps, True), reps)
                row = {
                    "frames": frames,
                    "dynamic": dynamic,
                    "graphed_ms": round(base_ms, 2),
                    "graphed_compiled_ms": round(compiled_ms, 2),
                    "speedup": round(base_ms / compiled_ms, 2),
                    ("compile_and_capture_all_s" if dynamic else "compile_and_capture_s"): round(warmup_s, 1),
                    "max_abs_diff": float((mel - base_mel).abs().max()),
                }
                rows.append(row)
                print(row, flush=True)
    return rows


def use_graphs_on(t2w: Token2Wav, config: FlowGraphConfig) -> CaptureReport:
    """Capture the flow's and HiFT's graphs on CUDA; elsewhere the decoder runs its padded calls eagerly, the
    encoder's buckets replay eagerly and HiFT has none."""
    flow = t2w.flow
    if t2w.device.type == "cuda":
        report = flow.use_cuda_graphs(config)
        t2w.hift.use_cuda_graphs()
        return report
    flow.graphed_decoder = GraphedCFM(flow.decoder, flow.config.cfm.n_timesteps, config)
    flow.encoder_graphs = flow.bucketed_encoder(config, capture=capture_eagerly)
    flow.encoder_graphs.capture_on_cpu(config.streaming)
    return CaptureReport(graphs=0, seconds=0.0, pool_mib=0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--preset", choices=("full", "tiny"), default="full", help="without --model-dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto", help="flow dtype; auto: float16 on CUDA, float32 on CPU")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--prompt-tokens", type=int, default=PROMPT_TOKENS, help="reference speech tokens (25/s)"
    )
    parser.add_argument("--out", type=Path, default=Path("flow_graphs.json"))
    parser.add_argument("--streams", type=lambda v: [int(n) for n in v.split(",")], default=[1, 4, 16])
    parser.add_argument(
        "--eager-max-streams",
        type=int,
        default=None,
        help="run the eager side of the lockstep streams only up to this many (16 eager streams take a minute)",
    )
    parser.add_argument(
        "--graph-batch-sizes",
        type=lambda v: tuple(sorted({int(n) for n in v.split(",")})),
        default=(1, 2, 4, 8, 16),
        help="batch sizes to capture (run.sh serves with 1,2,4,8; more streams go in several batches)",
    )
    parser.add_argument(
        "--compile-frames",
        type=lambda v: [int(n) for n in v.split(",") if n],
        default=[],
        help="also time the estimator under torch.compile at these padded frame counts (about a minute each)",
    )
    parser.add_argument("--compile-only", action="store_true", help="only the --compile-frames comparison")
    parser.add_argument(
        "--compile-dynamic",
        action="store_true",
        help="compile once with dynamic sizes for all --compile-frames",
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
        print("error: no CUDA GPU (use --device cpu --preset tiny for a dry check)", file=sys.stderr)
        return 1
    if device.type != "cuda" and (args.compile_frames or args.compile_only):
        parser.error("--compile-frames and --compile-only capture CUDA graphs: they need --device cuda")
    dtype = resolve_flow_dtype(args.dtype, device)
    with tempfile.TemporaryDirectory() as tmp:  # the synthetic checkpoint, gone once loaded
        model_dir = args.model_dir or write_token2wav(Path(tmp), args.preset)
        t2w = Token2Wav.from_model_dir(model_dir, device=device, dtype=dtype, seed=0)
    if args.qkv == "unfused":
        unfuse_qkv(t2w.flow)
    if args.convs == "cudnn":
        unpack_convs(t2w.flow)
    if args.compile_only:
        result = {
            "device": device_name(device),
            "torch": torch.__version__,
            "command": " ".join(sys.argv),
            "flow_dtype": str(dtype),
            "qkv": args.qkv,
            "convs": args.convs,
            "compiled_estimator": compile_rows(
                t2w, args.compile_frames, dtype, args.reps, args.compile_dynamic
            ),
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        return 0
    flow, steps = t2w.flow, t2w.flow.config.cfm.n_timesteps
    graph_config = FlowGraphConfig(batch_sizes=args.graph_batch_sizes)  # the default buckets and memory limit
    report = use_graphs_on(t2w, graph_config)
    graphed = flow.graphed_decoder
    hift_graphs = (t2w.hift.f0_graphs, t2w.hift.decode_graphs)
    encoder_graphs = flow.encoder_graphs

    def use_graphs(decoder) -> None:
        flow.graphed_decoder = decoder
        flow.encoder_graphs = encoder_graphs if decoder is not None else None
        t2w.hift.f0_graphs, t2w.hift.decode_graphs = hift_graphs if decoder is not None else (None, None)

    result: dict = {
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "model": str(args.model_dir) if args.model_dir else f"synthetic {args.preset}, seed 0",
        "flow_dtype": str(dtype),
        "qkv": args.qkv,
        "convs": args.convs,
        "capture": {
            "graphs": report.graphs,
            "seconds": round(report.seconds, 2),
            "pool_mib": round(report.pool_mib),
            "skipped_over_memory_limit": [list(k) for k in report.skipped],
            "buckets": list(graph_config.buckets),
            "batch_sizes": list(graph_config.batch_sizes),
        },
        "decoder": [],
    }

    for batch, frames in ((1, 186), (1, 400), (8, 186)):
        inputs = decoder_inputs(batch, frames, dtype, device)
        with torch.inference_mode():
            eager_mel = flow.decoder(*inputs, steps, True)
            graph_mel = graphed(*inputs, steps, True)
            eager = median_ms(lambda x=inputs: flow.decoder(*x, steps, True), args.reps, device)
            graph = median_ms(lambda x=inputs: graphed(*x, steps, True), args.reps, device)
        row = {
            "streams": batch,
            "frames": frames,
            "eager_ms": round(eager, 2),
            "graphed_ms": round(graph, 2),
            "speedup": round(eager / graph, 2),
            "max_abs_diff": float((graph_mel - eager_mel).abs().max()),
            "mel_abs_max": float(eager_mel.abs().max()),
        }
        result["decoder"].append(row)
        print(row, flush=True)

    result["encoder"] = encoder_rows(flow, args.reps, device)
    gen = torch.Generator(device=device).manual_seed(1)
    prompt_tokens = torch.randint(
        0, 6561, (1, args.prompt_tokens), device=device, generator=gen, dtype=torch.int32
    )
    prompt_feat = torch.randn(1, 2 * args.prompt_tokens, 80, device=device, generator=gen)
    embedding = torch.randn(1, 192, device=device, generator=gen)
    first = torch.randint(0, 6561, (1, FIRST_CHUNK_TOKENS), device=device, generator=gen, dtype=torch.int32)
    offline = torch.randint(0, 6561, (1, OFFLINE_TOKENS), device=device, generator=gen, dtype=torch.int32)

    def first_chunk() -> torch.Tensor:
        speech = t2w.stream("bench", first, prompt_tokens, prompt_feat, embedding, 0, False)
        t2w.close("bench")
        return speech

    def offline_call() -> torch.Tensor:
        return t2w.offline(offline, prompt_tokens, prompt_feat, embedding)

    hift_inference = t2w.hift.inference
    for path, decoder in (("eager", None), ("graphed", graphed)):
        use_graphs(decoder)
        clock = StageClock(device)
        first_ms = median_ms(first_chunk, args.reps, device)
        offline_ms = median_ms(offline_call, args.reps, device)
        kernels = kernels_per_call(first_chunk, device)
        inner = decoder or flow.decoder
        flow.graphed_decoder = clock.wrap("flow_decoder", inner)
        t2w.hift.inference = clock.wrap("hift", hift_inference)
        timed_total = clock.wrap("total", first_chunk)
        for _ in range(args.reps):
            timed_total()
        del t2w.hift.inference
        stages = {k: round(v / args.reps, 2) for k, v in clock.ms.items()}
        stages["flow_encoder_and_rest"] = round(stages["total"] - stages["flow_decoder"] - stages["hift"], 2)
        result[path] = {
            "first_chunk_ms": round(first_ms, 2),
            "offline_5s_ms": round(offline_ms, 2),
            "first_chunk_stages_ms": stages,
            "first_chunk_kernels": kernels,
        }
        print(path, {k: v for k, v in result[path].items() if k != "first_chunk_kernels"}, flush=True)
        print(f"{path} first chunk: {kernels['per_call']:.0f} {kernels['unit']}", flush=True)
    result["streams"] = []
    for streams in args.streams:
        eager = args.eager_max_streams is None or streams <= args.eager_max_streams
        for path, decoder in ((("eager", None),) if eager else ()) + (("graphed", graphed),):
            use_graphs(decoder)
            run_streams(t2w, streams, prompt_tokens, prompt_feat, embedding)  # warm-up
            row = {
                "streams": streams,
                "path": path,
                **run_streams(t2w, streams, prompt_tokens, prompt_feat, embedding),
            }
            result["streams"].append(row)
            print(row, flush=True)
    use_graphs(graphed)
    result["first_chunk_speedup"] = round(
        result["eager"]["first_chunk_ms"] / result["graphed"]["first_chunk_ms"], 2
    )
    result["graph_calls"] = dict(graphed.calls)
    result["shape_graph_calls"] = {
        g.name: {"captured": g.captured, "replays": g.replays, "eager": g.eager_calls}
        for g in hift_graphs
        if g is not None
    }
    result["encoder_graph_calls"] = dict(encoder_graphs.calls)
    if args.compile_frames:
        result["compiled_estimator"] = compile_rows(
            t2w, args.compile_frames, dtype, args.reps, args.compile_dynamic
        )
    args.out.write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
