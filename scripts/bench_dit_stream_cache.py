"""The DiT token2wav's per-stream estimator caches under streaming traffic: the time of a chunk's cache update
and the memory the caching allocator keeps.

A stream's estimator cache ([steps, depth, 2, heads, T, 2 * head_dim], prompt frames + the last 100 key frames)
takes each chunk's keys and is cut back. `two` copies appends then cuts (`extended(own).trimmed(head, tail)`,
the stream's path before the window), `one` does both in one copy (`extended(own, (head, tail))`).

1. One chunk's update at the full-size shape, each way, timed by CUDA events (median of `--reps`).
2. A traffic of `--streams` concurrent streams (speakers with prompts of 300-700 frames, 3-12 chunks a stream, a
   stream replaced when it ends), `--rounds` rounds, in a fresh process per variant (copies x allocator setting:
   the default and `expandable_segments:True`), recording the allocator's reserved and allocated memory; a
   reserve that keeps rising while the allocated peak does not is the allocator's fragmentation.

`--device cpu` runs both parts on small shapes (no allocator figures): what the tests run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tritontts.dit_token2wav.cfm import EstimatorCache

TAIL = 100
ALLOCATOR_SETTINGS = {"default": None, "expandable": "expandable_segments:True"}


@dataclass(frozen=True)
class Shape:
    steps: int = 10
    depth: int = 28
    heads: int = 8
    head_dim: int = 64
    hidden: int = 256

    def att(self, frames: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(
            self.steps, self.depth, 2, self.heads, frames, 2 * self.head_dim, device=device, dtype=dtype
        )

    def cnn(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(self.steps, self.depth, 2, 2 * self.hidden, 2, device=device, dtype=dtype)


SMALL = Shape(steps=2, depth=2, heads=2, head_dim=4, hidden=4)


def update(cache: EstimatorCache, own: EstimatorCache, keep: tuple[int, int], copies: str) -> EstimatorCache:
    if copies == "two":
        return cache.extended(own).trimmed(*keep)
    return cache.extended(own, keep)


def time_update(
    shape: Shape, device: torch.device, dtype: torch.dtype, prompt: int, chunk: int, reps: int
) -> dict:
    """ms of one later chunk's update (the cache at prompt + TAIL frames, `chunk` new ones), each way."""
    cache = EstimatorCache(shape.cnn(device, dtype), shape.att(prompt + TAIL, device, dtype).normal_())
    own = EstimatorCache(shape.cnn(device, dtype), shape.att(chunk, device, dtype).normal_())
    keep = (prompt, TAIL)
    same = torch.equal(update(cache, own, keep, "one").att, update(cache, own, keep, "two").att)
    result: dict = {
        "prompt_frames": prompt,
        "chunk_frames": chunk,
        "cache_mb": cache.att.nbytes / 1e6,
        "same": same,
    }
    for copies in ("two", "one"):
        times = []
        for _ in range(reps):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                update(cache, own, keep, copies)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                update(cache, own, keep, copies)
                times.append(1000 * (time.perf_counter() - began))
        result[f"{copies}_copies_ms"] = round(statistics.median(times), 4)
    return result


def traffic(args: argparse.Namespace, shape: Shape, device: torch.device, dtype: torch.dtype) -> dict:
    """The rounds of part 2 in this process: memory after every `--sample-every` rounds."""
    rng = random.Random(args.seed)
    cuda = device.type == "cuda"
    speakers = [shape.att(rng.randint(300, 700), device, dtype) for _ in range(args.speakers)]
    cnn = shape.cnn(device, dtype)
    entries = shape.att(args.max_chunk, device, dtype)  # the graph's output buffer a chunk's keys come from
    streams: list[dict] = []
    samples, began = [], time.perf_counter()
    for round_index in range(1, args.rounds + 1):
        while len(streams) < args.streams:
            prompt = speakers[rng.randrange(len(speakers))]
            cache = EstimatorCache(cnn, prompt)
            streams.append(
                {"cache": cache, "keep": (prompt.shape[4], TAIL), "left": rng.randint(3, 12), "done": 0}
            )
        for stream in streams:
            last = stream["left"] == 1
            frames = (
                args.first_chunk
                if stream["done"] == 0
                else rng.randint(6, args.chunk)
                if last
                else args.chunk
            )
            own = EstimatorCache(cnn.clone(), entries[:, :, :, :, :frames])
            stream["cache"] = update(stream["cache"], own, stream["keep"], args.copies)
            stream["left"] -= 1
            stream["done"] += 1
        streams = [s for s in streams if s["left"] > 0]
        if round_index % args.sample_every == 0 and cuda:
            torch.cuda.synchronize(device)
            samples.append(
                {
                    "round": round_index,
                    "reserved_mib": round(torch.cuda.memory_reserved(device) / 2**20),
                    "allocated_mib": round(torch.cuda.memory_allocated(device) / 2**20),
                    "max_allocated_mib": round(torch.cuda.max_memory_allocated(device) / 2**20),
                }
            )
    if cuda:
        torch.cuda.synchronize(device)
    return {
        "copies": args.copies,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "ms_per_round": round(1000 * (time.perf_counter() - began) / args.rounds, 3),
        "samples": samples,
    }


def run_variant(args: argparse.Namespace, copies: str, setting: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if setting:
        env["PYTORCH_CUDA_ALLOC_CONF"] = setting
    passed = sys.argv[1:]
    if "--output" in passed:
        at = passed.index("--output")
        passed = passed[:at] + passed[at + 2 :]
    command = [sys.executable, str(Path(__file__).resolve()), *passed, "--worker", "--copies", copies]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def summary(run: dict) -> dict:
    samples = run["samples"]
    if not samples:
        return {}
    quarter = samples[len(samples) // 4]
    return {
        "reserved_mib_at_quarter": quarter["reserved_mib"],
        "reserved_mib_at_end": samples[-1]["reserved_mib"],
        "max_allocated_mib": samples[-1]["max_allocated_mib"],
        "reserved_over_max_allocated": round(
            samples[-1]["reserved_mib"] / samples[-1]["max_allocated_mib"], 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument(
        "--prompt-frames", type=int, default=500, help="part 1: a 10 s prompt (25 Hz tokens x 2)"
    )
    parser.add_argument("--chunk", type=int, default=50, help="a later chunk's frames (25 tokens)")
    parser.add_argument("--first-chunk", type=int, default=56, help="a first chunk's frames")
    parser.add_argument("--max-chunk", type=int, default=64)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--streams", type=int, default=8, help="part 2: concurrent streams")
    parser.add_argument("--speakers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--sample-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--copies", choices=("one", "two"), default="one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    shape = Shape() if device.type == "cuda" else SMALL
    if args.worker:
        print(json.dumps(traffic(args, shape, device, dtype)))
        return
    update_ms = time_update(shape, device, dtype, args.prompt_frames, args.chunk, args.reps)
    settings = ALLOCATOR_SETTINGS if device.type == "cuda" else {"default": None}
    runs = []
    for name, setting in settings.items():
        for copies in ("two", "one"):
            run = run_variant(args, copies, setting)
            runs.append({"allocator": name, **run, "summary": summary(run)})
            print(
                f"{name:10s} {copies} copies: {run['ms_per_round']} ms/round {runs[-1]['summary']}",
                flush=True,
            )
    result = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "shape": asdict(shape),
        "update": update_ms,
        "traffic": runs,
    }
    print(json.dumps(update_ms))
    if args.output:
        args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
