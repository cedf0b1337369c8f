"""Spark-TTS's audio side on one device: BiCodec's detokenize (the `vocoder` model) the earlier way (eager, one
group per length) and in padded passes, eager and from CUDA graphs; tokenize (the `audio_tokenizer`: wav2vec2 +
BiCodec's encoders) in fp32 and bf16, and with references of a new length each call unpadded and padded to whole
seconds. A synthetic checkpoint in the official layout is written unless given.

    python scripts/bench_spark_codec.py [--model-dir CKPT] [--preset full] [--reps 10] [--out FILE.json]

Rows: median ms of one call, and each variant's audio against the earlier way's (largest difference, SNR in dB).
`batch16` is what the vocoder model runs when 16 offline requests of different lengths arrive together (--batch);
`fresh` cases take lengths never seen before in every call, as offline requests do. `--device cpu --preset tiny`
is a dry check of everything but the capture (the graphed variant then runs its padded passes eagerly)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from tritontts.bench.offline_timing import device_name, median_ms
from tritontts.spark.codec import SparkCodec

LENGTHS = (50, 150, 216, 320)  # 50: a stream's first chunk
BATCH = 16
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    noise = float(np.sum((reference - other) ** 2))
    return float("inf") if noise == 0 else 10 * float(np.log10(np.sum(reference**2) / noise))


def token_rows(lengths: tuple[int, ...], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    globals_ = [rng.integers(0, 4096, 32, dtype=np.int32) for _ in lengths]
    return globals_, [rng.integers(0, 8192, n, dtype=np.int32) for n in lengths]


def groups_by_length(codec: SparkCodec, g: list[np.ndarray], s: list[np.ndarray]) -> list[np.ndarray]:
    """The earlier vocoder: one padded batch split by BiCodec into groups of equal length, eager."""
    lengths = [len(x) for x in s]
    padded = np.zeros((len(s), max(lengths)), dtype=np.int64)
    for i, x in enumerate(s):
        padded[i, : len(x)] = x
    device = codec.device
    audio = codec.bicodec.detokenize(
        torch.as_tensor(np.stack(g), device=device),
        torch.as_tensor(padded, device=device),
        torch.tensor(lengths, device=device),
    )
    audio = audio.float().cpu().numpy()
    return [audio[i, : n * codec.bicodec.hop_length] for i, n in enumerate(lengths)]


VARIANTS = {  # CUDA graphs, call, dtype, TF32 matmuls
    "groups, eager (earlier)": (False, groups_by_length, torch.float32, False),
    "padded passes, eager": (False, SparkCodec.detokenize, torch.float32, False),
    "padded passes, CUDA graphs": (True, SparkCodec.detokenize, torch.float32, False),
    "padded passes, CUDA graphs, TF32 matmuls": (True, SparkCodec.detokenize, torch.float32, True),
    "padded passes, CUDA graphs, bf16": (True, SparkCodec.detokenize, torch.bfloat16, False),
}


def release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def detokenize_rows(model_dir: Path, reps: int, device: torch.device, batch: int) -> list[dict]:
    """Fixed cases repeat their lengths; `fresh` cases draw new lengths for every call, as offline requests do."""
    cases = {f"len{n}": (n,) for n in LENGTHS} | {f"batch{batch}": tuple(150 + 11 * i for i in range(batch))}
    inputs = {name: token_rows(lengths, seed) for seed, (name, lengths) in enumerate(cases.items())}
    fresh = {"fresh1": 1, f"fresh{batch}": batch}
    reference: dict[str, list[np.ndarray]] = {}
    rows = []
    for variant, (graphs, call, dtype, tf32) in VARIANTS.items():
        torch.backends.cuda.matmul.allow_tf32 = tf32
        codec = SparkCodec(model_dir, device, dtype, with_tokenizer=False, cuda_graphs=graphs)
        for name, (g, s) in inputs.items():
            audio = call(codec, g, s)
            audio = call(codec, g, s)
            ms = median_ms(lambda g=g, s=s, c=codec, f=call: f(c, g, s), reps, device)
            reference.setdefault(name, audio)
            ref, out = np.concatenate(reference[name]), np.concatenate(audio)
            rows.append(
                {
                    "call": "detokenize",
                    "variant": variant,
                    "case": name,
                    "frames": sum(cases[name]),
                    "ms": round(ms, 2),
                    "max_abs_diff": float(np.abs(out - ref).max()),
                    "snr_db": round(snr_db(ref, out), 1),
                }
            )
            print(rows[-1], flush=True)
        for name, items in fresh.items():
            draws = iter(range(1000))

            def one(c=codec, items=items, draws=draws, f=call):
                f(c, *token_rows(tuple(150 + next(draws) for _ in range(items)), 0))

            rows.append(
                {
                    "call": "detokenize",
                    "variant": variant,
                    "case": name,
                    "ms": round(median_ms(one, reps, device), 2),
                }
            )
            print(rows[-1], flush=True)
        codec = None
        release(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def tokenize_rows(model_dir: Path, reps: int, device: torch.device) -> list[dict]:
    torch.backends.cudnn.benchmark = False
    rng = np.random.default_rng(0)
    wav = (0.1 * rng.standard_normal(16000 * 6)).astype(np.float32)
    rows, reference = [], None
    for dtype_name, dtype in DTYPES.items():
        codec = SparkCodec(model_dir, device, dtype)
        (voice,) = codec.tokenize([wav])
        ms = median_ms(lambda c=codec: c.tokenize([wav]), reps, device)
        reference = reference or voice
        rows.append(
            {
                "call": "tokenize",
                "case": "6 s reference",
                "dtype": dtype_name,
                "ms": round(ms, 2),
                "global_tokens_equal": float(np.mean(voice.global_tokens == reference.global_tokens)),
                "semantic_tokens_equal": float(np.mean(voice.semantic_tokens == reference.semantic_tokens)),
            }
        )
        print(rows[-1], flush=True)
        codec = None
        release(device)
    return rows + bucket_rows(model_dir, reps, rng, device)


def bucket_rows(model_dir: Path, reps: int, rng: np.random.Generator, device: torch.device) -> list[dict]:
    """Tokenize of a reference whose length is new in every call (6-7 s), unpadded and padded to whole
    seconds after `warm_tokenizer`, fp32; and how the two paths' tokens compare."""
    wav = (0.1 * rng.standard_normal(16000 * 7)).astype(np.float32)
    lengths = [16000 * 6 + 113 * k + 7 for k in range(2 * reps + 8)]
    rows, voices = [], {}
    for bucket in (0, 16000):
        codec = SparkCodec(model_dir, device, torch.float32, cuda_graphs=False, reference_bucket=bucket)
        warmed = codec.warm_tokenizer(8.0)
        fresh = iter(lengths)
        ms = median_ms(lambda c=codec, f=fresh: c.tokenize([wav[: next(f)]]), reps, device)
        repeated = median_ms(lambda c=codec: c.tokenize([wav[: lengths[0]]]), reps, device)
        voices[bucket] = codec.tokenize([wav[: lengths[-1]]])[0]
        rows.append(
            {
                "call": "tokenize",
                "case": "6-7 s reference, a new length each call",
                "reference_bucket": bucket,
                "lengths_warmed_at_load": warmed,
                "ms": round(ms, 2),
                "repeated_length_ms": round(repeated, 2),
            }
        )
        print(rows[-1], flush=True)
        codec = None
        release(device)
    rows[-1]["semantic_tokens_equal_unpadded"] = float(
        np.mean(voices[0].semantic_tokens == voices[16000].semantic_tokens)
    )
    rows[-1]["global_tokens_equal_unpadded"] = float(
        np.mean(voices[0].global_tokens == voices[16000].global_tokens)
    )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=None, help="a Spark-TTS checkpoint (default: synthetic)")
    p.add_argument(
        "--preset", default="full", help="synthetic checkpoint preset when --model-dir is not given"
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batch", type=int, default=BATCH, help="requests of the batched detokenize cases")
    p.add_argument("--calls", default="detokenize,tokenize", help="which calls to time, comma-separated")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (use --device cpu --preset tiny for a dry check)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from tritontts.synthetic.spark import write_spark_checkpoint

            model_dir = write_spark_checkpoint(Path(tmp) / "spark", args.preset)
        calls = args.calls.split(",")
        rows = (
            detokenize_rows(model_dir, args.reps, device, args.batch) if "detokenize" in calls else []
        ) + (tokenize_rows(model_dir, args.reps, device) if "tokenize" in calls else [])
    result = {
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "rows": rows,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
