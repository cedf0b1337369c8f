"""Spark-TTS's vocoder (BiCodec's detokenize in padded passes from CUDA graphs) with its passes eager and compiled
by torch.compile (`--vocoder_compile`): load and capture time, ms per call for a stream's first chunk (50 frames),
216 frames and 16 rows of 150, CUDA kernels in one 50-frame pass, and the compiled audio against the eager.
A synthetic checkpoint in the official layout is written unless given. One CUDA GPU.

    python scripts/bench_vocoder_compile.py [--model-dir CKPT] [--reps 50] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from tritontts.spark.codec import SparkCodec
from tritontts.spark.padded_detokenize import PaddedDetokenizer

CASES = {"50x1": (50, 1), "216x1": (216, 1), "150x16": (150, 16)}  # frames x rows


def case_tokens(seed: int = 0) -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
    rng = np.random.default_rng(seed)
    return {
        name: (
            [rng.integers(0, 4096, 32).astype(np.int32)] * rows,
            [rng.integers(0, 8192, frames).astype(np.int32) for _ in range(rows)],
        )
        for name, (frames, rows) in CASES.items()
    }


def ms_per_call(call, reps: int) -> float:
    for _ in range(5):
        call()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        call()
    torch.cuda.synchronize()
    return round((time.perf_counter() - start) / reps * 1e3, 3)


def kernels_per_pass(detokenizer: PaddedDetokenizer, frames: int = 50) -> int:
    tensors = (
        torch.zeros(1, 32, dtype=torch.int64, device="cuda"),
        torch.zeros(1, frames, dtype=torch.int64, device="cuda"),
        torch.full((1,), frames, dtype=torch.int64, device="cuda"),
    )
    with torch.inference_mode():
        detokenizer.run_pass(*tensors)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            detokenizer.run_pass(*tensors)
            torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def snr_db(reference: np.ndarray, other: np.ndarray) -> float | None:
    noise = float(np.sum((reference - other) ** 2))
    return None if noise == 0 else round(10 * float(np.log10(np.sum(reference**2) / noise)), 1)


def measure(model_dir: Path, reps: int) -> dict:
    tokens = case_tokens()
    result: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    audio = {}
    for name, compiled in (("graphs", False), ("graphs_compiled", True)):
        start = time.perf_counter()
        codec = SparkCodec(
            model_dir, "cuda", with_tokenizer=False, cuda_graphs=True, compile_vocoder=compiled
        )
        row = {"captured": codec.detokenizer.warm(), "load_and_warm_s": round(time.perf_counter() - start, 1)}
        for case, (g, s) in tokens.items():
            row[f"ms_{case}"] = ms_per_call(lambda c=codec, g=g, s=s: c.detokenize(g, s), reps)
        row["kernels_50x1_pass"] = kernels_per_pass(codec.detokenizer)
        audio[name] = {case: np.concatenate(codec.detokenize(g, s)) for case, (g, s) in tokens.items()}
        result[name] = row
        print(name, row, flush=True)
        codec = None
        torch.cuda.empty_cache()
    result["compiled_vs_eager"] = {
        case: {
            "max_abs": float(np.abs(audio["graphs"][case] - audio["graphs_compiled"][case]).max()),
            "snr_db": snr_db(audio["graphs"][case], audio["graphs_compiled"][case]),
        }
        for case in CASES
    }
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None, help="a Spark-TTS checkpoint (default: synthetic)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA device (CUDA graphs)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from tritontts.synthetic.spark import write_spark_checkpoint

            model_dir = write_spark_checkpoint(Path(tmp) / "spark", "full")
        result = measure(model_dir, args.reps) | {"command": " ".join(sys.argv)}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
