#!/usr/bin/env python3
"""First-chunk latency of a streaming BLS with a reference audio vs. with that reference's saved voice profile.

Against a running tritonserver with a decoupled BLS (run.sh stage 3, streaming). Every request uses a reference
no earlier request used (the prompt audio plus a little noise of its own seed), so neither the BLS's nor the
audio_tokenizer's voice cache can serve it: the "reference" requests run the front-end models (audio_tokenizer,
and for CosyVoice2 the speaker_embedding and the prompt mel) before the LLM; the "profile" requests send the
reference's profile (made beforehand with a `voice_profile` request, not timed) and run none of them. Each stream
is cancelled after its first chunk. Writes one JSON file (medians, p90, means, every sample).

    python scripts/bench_voice_profile.py --model cosyvoice2 --server-url localhost:8001 --requests 20 \
        --output benchmarks/voice_profile_cosyvoice2_h100_full_synthetic.json
"""

from __future__ import annotations

import argparse
import json
import platform
import queue
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from tritontts.audio import load_wav
from tritontts.bench import triton_io
from tritontts.voice_profile import (
    CHECKPOINT_OUTPUT,
    KIND_ARRAYS,
    OUTPUT_PREFIX,
    PROFILE_PARAMETER,
    VoiceProfile,
)

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"spark_tts": "spark_tts", "cosyvoice2": "cosyvoice2", "cosyvoice2_dit": "cosyvoice2_dit"}
DEFAULT_REFERENCE = ROOT.parent / "shared" / "data" / "prompt_zh.wav"
TEXT = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
REFERENCE_TEXT = "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(KINDS), default="cosyvoice2", help="the model family")
    p.add_argument("--bls-model", default=None, help="the decoupled BLS's name (default: --model)")
    p.add_argument("--server-url", default="localhost:8001", help="Triton's gRPC address")
    p.add_argument("--reference-wav", type=Path, default=DEFAULT_REFERENCE)
    p.add_argument("--reference-text", default=REFERENCE_TEXT)
    p.add_argument("--reference-seconds", type=float, default=5.0, help="the reference is cut to this length")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--requests", type=int, default=20, help="requests per kind (after --warmup of each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--output", type=Path, required=True)
    return p.parse_args(argv)


def fresh_reference(wav: np.ndarray, seed: int) -> np.ndarray:
    """The reference with noise of its own seed at -80 dBFS: new content for every cache, the same voice."""
    noise = np.random.default_rng(seed).standard_normal(wav.size).astype(np.float32) * 1e-4
    return np.clip(wav + noise, -1.0, 1.0).astype(np.float32)


def profile_of(client, model: str, kind: str, wav: np.ndarray) -> VoiceProfile:
    arrays = triton_io.request_arrays(wav, "", "-")
    names = [OUTPUT_PREFIX + n for n in KIND_ARRAYS[kind]] + [CHECKPOINT_OUTPUT]
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer(
            model,
            triton_io.infer_inputs(grpcclient, arrays),
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
            parameters={PROFILE_PARAMETER: True},
        )
        result, error = events.get(timeout=300)
        if error is not None:
            raise RuntimeError(f"profile request failed: {error}")
        return VoiceProfile.from_outputs(kind, {n: result.as_numpy(n) for n in names})
    finally:
        client.stop_stream()


def first_chunk_seconds(url: str, model: str, arrays: dict[str, np.ndarray]) -> float:
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error, time.perf_counter())))
    start = time.perf_counter()
    client.async_stream_infer(
        model, triton_io.infer_inputs(grpcclient, arrays), outputs=triton_io.requested_outputs(grpcclient)
    )
    try:
        while True:
            result, error, arrived = events.get(timeout=300)
            if error is not None:
                raise RuntimeError(f"stream failed: {error}")
            if triton_io.waveform(result).size:
                return arrived - start
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1000 for s in seconds)
    return {
        "median_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[min(len(ms) - 1, int(0.9 * len(ms)))], 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "samples_ms": [round(v, 2) for v in ms],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kind, model = KINDS[args.model], args.bls_model or args.model
    wav = load_wav(args.reference_wav, triton_io.REFERENCE_SAMPLE_RATE)[: int(args.reference_seconds * 16000)]
    texts = {"target_text": np.array([[args.text.encode()]], dtype=object)}
    reference_text = {"reference_text": np.array([[args.reference_text.encode()]], dtype=object)}
    control = grpcclient.InferenceServerClient(args.server_url)
    timings: dict[str, list[float]] = {"reference": [], "profile": []}
    seed = 0
    for index in range(args.warmup + args.requests):
        seed += 1
        with_audio = triton_io.request_arrays(fresh_reference(wav, seed), args.reference_text, args.text)
        reference = first_chunk_seconds(args.server_url, model, with_audio)
        seed += 1
        fresh = fresh_reference(wav, seed)
        profile = profile_of(control, model, kind, fresh)
        with_profile = texts | reference_text | profile.request_arrays()
        if kind == "cosyvoice2_dit":  # its token2wav takes the audio itself
            with_profile |= {k: v for k, v in triton_io.request_arrays(fresh, "", "").items() if "wav" in k}
        profiled = first_chunk_seconds(args.server_url, model, with_profile)
        if index >= args.warmup:
            timings["reference"].append(reference)
            timings["profile"].append(profiled)
    control.close()
    result = {
        "what": "first-chunk latency of a streamed request: fresh reference audio vs. its saved voice profile",
        "model": model,
        "kind": kind,
        "server_url": args.server_url,
        "requests": args.requests,
        "reference_seconds": round(wav.size / 16000, 3),
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "host": platform.node(),
        "reference": summary(timings["reference"]),
        "profile": summary(timings["profile"]),
    }
    result["median_gain_ms"] = round(result["reference"]["median_ms"] - result["profile"]["median_ms"], 2)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(
        json.dumps(
            {k: v for k, v in result.items() if k not in ("reference", "profile")}
            | {
                "reference_median_ms": result["reference"]["median_ms"],
                "profile_median_ms": result["profile"]["median_ms"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
