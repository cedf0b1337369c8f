"""The vocoders eager against replayed from their per-length CUDA graphs, in one process on one GPU:
CosyVoice2's HiFT (also the DiT token2wav's) and CosyVoice3's causal HiFT, full-size synthetic weights, fp32.

    python scripts/bench_vocoder_graphs.py [--reps 20] [--out FILE.json]

For each mel length: the median time of one call, both ways, and the largest difference in the audio (the same
source noise both ways: CosyVoice2's from one generator seed per call, CosyVoice3's fixed). `--device cpu
--preset tiny` is a dry check of everything but the capture (both ways then run eagerly)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from tritontts.bench.offline_timing import device_name, median_ms
from tritontts.shape_graphs import ShapeGraphs

MEL_FRAMES = (42, 100, 186, 400)


def compare(
    name: str,
    call: Callable[[torch.Tensor], torch.Tensor],
    switch: Callable[[bool], None],
    reps: int,
    device: torch.device,
) -> list[dict]:
    rows = []
    for frames in MEL_FRAMES:
        mel = torch.randn(1, 80, frames, device=device, generator=torch.Generator(device).manual_seed(frames))
        switch(False)
        eager_audio = call(mel)
        eager = median_ms(lambda m=mel: call(m), reps, device)
        switch(True)
        call(mel), call(mel)  # the second sighting of a length captures it
        graph_audio = call(mel)
        graph = median_ms(lambda m=mel: call(m), reps, device)
        rows.append(
            {
                "model": name,
                "mel_frames": frames,
                "eager_ms": round(eager, 2),
                "graphed_ms": round(graph, 2),
                "speedup": round(eager / graph, 2),
                "max_abs_diff": float((graph_audio - eager_audio).abs().max()),
                "audio_abs_max": float(eager_audio.abs().max()),
            }
        )
        print(rows[-1], flush=True)
    return rows


def cosyvoice2_rows(folder: Path, preset: str, reps: int, device: torch.device) -> list[dict]:
    from tritontts.cosyvoice2.hift import load_hift
    from tritontts.synthetic.cosyvoice2_hift import preset_config, write_hift

    write_hift(folder, preset, seed=0)
    hift = load_hift(folder, preset_config(preset), device)
    if device.type == "cuda":
        hift.use_cuda_graphs()
    graphs: tuple[ShapeGraphs | None, ShapeGraphs | None] = (hift.f0_graphs, hift.decode_graphs)

    def switch(on: bool) -> None:
        hift.f0_graphs, hift.decode_graphs = graphs if on else (None, None)

    def call(mel: torch.Tensor) -> torch.Tensor:
        return hift.inference(mel, generator=torch.Generator(device).manual_seed(7))[0]

    return compare("cosyvoice2 HiFT", call, switch, reps, device)


def cosyvoice3_rows(folder: Path, preset: str, reps: int, device: torch.device) -> list[dict]:
    from tritontts.cosyvoice3.hift import load_causal_hift
    from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav

    write_cosyvoice3_token2wav(folder, preset, seed=0)
    hift = load_causal_hift(folder, device=device, max_seconds=30)
    if device.type == "cuda":
        hift.use_cuda_graphs()
    graphs = hift.graphs

    def switch(on: bool) -> None:
        hift.graphs = graphs if on else None

    def call(mel: torch.Tensor) -> torch.Tensor:
        return hift.inference(mel, finalize=False)[0]

    return compare("cosyvoice3 causal HiFT (finalize false)", call, switch, reps, device)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--preset", choices=("full", "tiny"), default="full", help="the synthetic weights' size"
    )
    parser.add_argument("--out", type=Path, default=Path("vocoder_graphs.json"))
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU (use --device cpu --preset tiny for a dry check)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        rows = cosyvoice2_rows(Path(tmp) / "cosyvoice2", args.preset, args.reps, device)
        rows += cosyvoice3_rows(Path(tmp) / "cosyvoice3", args.preset, args.reps, device)
    result = {
        "device": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "preset": args.preset,
        "cuda_graphs": device.type == "cuda",
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
