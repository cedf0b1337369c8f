#!/usr/bin/env python3
"""The CosyVoice2 token2wav first chunk alone and beside an LLM that decodes on the same GPU, as a streamed
request meets it in Triton (the LLM goes on decoding the request while token2wav makes its first chunk).

    python scripts/bench_gpu_sharing.py [--arms alone,llm,llm_first_chunk_priority,llm_sm50] [--stream-priority high]

Each arm other than `alone` starts this script again as `--role llm` in a child process: the full-size
synthetic Qwen2 LLM (random weights, bf16, CUDA graphs) decoding one request after another at batch 1 on the
engine's own thread, as in Triton, with the arm's environment (MPS client priority, MPS active-thread
percentage: only MPS reads them, so run the script under a running MPS daemon to test them). In
`llm_first_chunk_priority` the two share a first-chunk board, as run.sh's `--first_chunk_priority true` (the
default) gives token2wav and the LLM: the parent holds it while it makes each first chunk and the engine holds
its steps meanwhile (`tritontts/triton/first_chunk_priority.py`; the chunks here follow each other, so the LLM's
rate beside them is lower than a server's). Meanwhile the parent times the first streamed chunk (15 + 3
look-ahead tokens after a --prompt-tokens prompt) through `Token2Wav.stream` with the flow decoder, encoder and
HiFT replayed from CUDA graphs (captured and replayed on a stream of --stream-priority). The child's decode
steps per second, alone and beside token2wav, say what the LLM pays. Writes one JSON file. `--compile` compiles the flow
estimator inside its graphs, as run.sh's `--token2wav_compile true`. `--device cpu --preset
tiny` is a dry check of everything but the GPU: tiny models, fp32, no CUDA graphs, the MPS variables unread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tritontts.bench.kernel_profile import kernels_per_call
from tritontts.bench.offline_timing import device_name, synchronize
from tritontts.bench.stats import percentile
from tritontts.triton.first_chunk_priority import FirstChunkHolder, YieldToFirstChunks, holding

ARM_ENVIRONMENTS = {
    "alone": None,
    "llm": {},
    "llm_below_normal": {"CUDA_MPS_CLIENT_PRIORITY": "1"},
    "llm_sm50": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
    "llm_sm25": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"},
    "llm_below_normal_sm50": {"CUDA_MPS_CLIENT_PRIORITY": "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"},
    "llm_first_chunk_priority": {},
}
BOARD_ARMS = {"llm_first_chunk_priority"}
BOARD_VARIABLE = "TRITONTTS_BENCH_FIRST_CHUNK_BOARD"
"""the board's path, in the child's environment of a BOARD_ARMS arm"""
PROMPT_TOKENS = 75
FIRST_CHUNK_TOKENS = 15 + 3
AUDIO_TOKENS_PER_S = 25.0
LLM_VOCAB = 158_000


def run_llm(device: torch.device, preset: str) -> int:
    """Decode at batch 1 until SIGTERM; prints `ready` after the first steps, then steps per second."""
    from tritontts.llm.config import Qwen2Config
    from tritontts.llm.engine import LLMEngine
    from tritontts.llm.loader import build_model
    from tritontts.llm.sequence import SamplingParams, TokenEvent
    from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    raw = qwen2_config(preset, vocab_size=LLM_VOCAB, dtype=dtype)
    state = qwen2_state_dict(preset, seed=0, vocab_size=LLM_VOCAB, dtype=dtype)
    model = build_model(Qwen2Config.from_dict(raw), state, device, dtype, source="synthetic")
    engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=2560)
    board = os.environ.get(BOARD_VARIABLE)
    if board:
        engine.pause_check = YieldToFirstChunks(Path(board), AUDIO_TOKENS_PER_S, FIRST_CHUNK_TOKENS)
    params = SamplingParams(max_tokens=2000, temperature=0.8, top_k=50, top_p=0.95, seed=0)
    prompt = torch.randint(0, LLM_VOCAB, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    tokens, finished = [0], threading.Event()  # at batch 1, a token per decode step

    def count(event: TokenEvent) -> None:
        tokens[0] += len(event.token_ids)
        if event.finished:
            finished.set()

    stop, marks = [], []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGUSR1, lambda *_: marks.append((tokens[0], time.perf_counter(), engine.paused_s)))
    engine.start()
    while not stop:
        finished.clear()
        engine.add_request(prompt, params, count)
        while not (finished.wait(0.01) or stop):
            if not marks and tokens[0] >= 50:
                marks.append((tokens[0], time.perf_counter(), engine.paused_s))
                print("ready", flush=True)
    engine.stop()
    (s0, t0, _), (s1, t1, h1), (s2, t2, h2) = marks[:3]
    rates = {
        "decode_steps_per_s_alone": (s1 - s0) / (t1 - t0),
        "decode_steps_per_s_shared": (s2 - s1) / (t2 - t1),
        "llm_held_s_shared": h2 - h1,
    }
    print(
        json.dumps({k: round(v, 3 if k.startswith("llm_held") else 1) for k, v in rates.items()}), flush=True
    )
    return 0


def start_llm(overrides: dict[str, str], device: torch.device, preset: str) -> subprocess.Popen:
    env = os.environ | overrides
    command = [sys.executable, __file__, "--role", "llm", "--device", str(device), "--preset", preset]
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    if line.strip() != "ready":
        child.kill()
        raise RuntimeError(f"the LLM process did not start decoding: {line!r}")
    time.sleep(2.0)
    child.send_signal(signal.SIGUSR1)  # its rate alone ends, its rate beside token2wav starts
    return child


def stop_llm(child: subprocess.Popen) -> dict:
    child.send_signal(signal.SIGUSR1)
    time.sleep(0.1)
    child.send_signal(signal.SIGTERM)
    out, _ = child.communicate(timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def build_token2wav(
    prompt_tokens: int, priority: str, device: torch.device, preset: str, convs: str, compile_estimator: bool
):
    from tritontts.conv_gemm import unpack_convs
    from tritontts.cosyvoice2.token2wav import Token2Wav
    from tritontts.cuda_graphs import FlowGraphConfig
    from tritontts.synthetic.cosyvoice2_flow import write_cosyvoice2_yaml, write_flow
    from tritontts.synthetic.cosyvoice2_hift import write_hift

    cuda = device.type == "cuda"
    if cuda and priority == "high":  # PyTorch maps a priority past the device's range to its highest
        torch.cuda.set_stream(torch.cuda.Stream(device, priority=-100))
    with tempfile.TemporaryDirectory() as folder:
        write_cosyvoice2_yaml(folder, preset)
        write_flow(folder, preset, seed=0)
        write_hift(folder, preset, seed=0)
        dtype = torch.float16 if cuda else torch.float32
        t2w = Token2Wav.from_model_dir(folder, device=device, dtype=dtype, seed=0)
    if convs == "cudnn":
        unpack_convs(t2w.flow)
    if cuda:
        config = FlowGraphConfig(batch_sizes=(1,), streaming=(True,), compile=compile_estimator)
        t2w.flow.use_cuda_graphs(config)
        t2w.hift.use_cuda_graphs()
    gen = torch.Generator(device=device).manual_seed(1)
    prompt = torch.randint(0, 6561, (1, prompt_tokens), device=device, generator=gen, dtype=torch.int32)
    feat = torch.randn(1, 2 * prompt_tokens, 80, device=device, generator=gen)
    embedding = torch.randn(1, 192, device=device, generator=gen)
    first = torch.randint(0, 6561, (1, FIRST_CHUNK_TOKENS), device=device, generator=gen, dtype=torch.int32)

    @torch.inference_mode()
    def first_chunk() -> None:
        t2w.stream("bench", first, prompt, feat, embedding, 0, False)
        t2w.close("bench")
        synchronize(device)

    return first_chunk


def held_by(holder: FirstChunkHolder, call: Callable[[], None]) -> Callable[[], None]:
    """`call` holding the LLM on `holder`'s board, as a token2wav instance makes a stream's first chunk."""

    def held() -> None:
        with holding(holder, True):
            call()

    return held


def time_calls(call, reps: int) -> dict:
    for _ in range(3):
        call()
    ms = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        ms.append(1e3 * (time.perf_counter() - start))
    return {
        "first_chunk_ms_median": round(percentile(ms, 50), 2),
        "first_chunk_ms_p90": round(percentile(ms, 90), 2),
        "first_chunk_ms_min": round(min(ms), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["bench", "llm"], default="bench")
    parser.add_argument(
        "--arms", default="alone,llm", help=f"comma-separated of {', '.join(ARM_ENVIRONMENTS)}"
    )
    parser.add_argument("--stream-priority", choices=["high", "normal"], default="normal")
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--preset", choices=("full", "tiny"), default="full", help="the synthetic models' size"
    )
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument(
        "--convs",
        choices=("packed", "cudnn"),
        default="packed",
        help="cudnn: the flow's convolutions in cuDNN, as before loading packed them (an A/B in one session)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="the flow estimator compiled by torch.compile inside its graphs (run.sh --token2wav_compile true)",
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_sharing.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (use --device cpu --preset tiny for a dry check)", file=sys.stderr)
        return 1
    if args.role == "llm":
        return run_llm(device, args.preset)
    arms = args.arms.split(",")
    unknown = [arm for arm in arms if arm not in ARM_ENVIRONMENTS]
    if unknown:
        parser.error(f"--arms: unknown {unknown}")
    first_chunk = build_token2wav(
        args.prompt_tokens, args.stream_priority, device, args.preset, args.convs, args.compile
    )
    result: dict = {
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "preset": args.preset,
        "mps_pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
        "stream_priority": args.stream_priority,
        "convs": args.convs,
        "estimator_compiled": args.compile,
        "prompt_tokens": args.prompt_tokens,
        "kernels_per_chunk": kernels_per_call(first_chunk, device, top=5),
        "arms": {},
    }
    for arm in arms:
        overrides, holder, call = ARM_ENVIRONMENTS[arm], None, first_chunk
        if arm in BOARD_ARMS:
            holder = FirstChunkHolder(Path(tempfile.mkdtemp()) / "first_chunks")
            overrides, call = {BOARD_VARIABLE: str(holder.path)}, held_by(holder, first_chunk)
        child = None if overrides is None else start_llm(overrides, device, args.preset)
        row = {"llm_environment": overrides, **time_calls(call, args.reps)}
        if child is not None:
            row |= stop_llm(child)
        if holder is not None:
            holder.close()
            holder.path.parent.rmdir()
            row["llm_environment"] = {BOARD_VARIABLE: "<a temporary file>"}
        result["arms"][arm] = row
        print(arm, row, flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
