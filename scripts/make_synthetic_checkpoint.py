"""Write a Spark-TTS-0.5B checkpoint directory with random weights, for tests and demos without downloads."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritontts.synthetic.spark import MARKER, PRESETS, is_complete, read_marker, write_spark_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--preset", choices=PRESETS, default="tiny", help="tiny: small test sizes; full: real sizes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="rewrite even when the directory is complete")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir: Path = args.output_dir
    if not args.force and is_complete(out_dir, args.preset, args.seed):
        print(
            f"{out_dir} already holds a complete synthetic checkpoint (preset={args.preset}, seed={args.seed})"
        )
        return 0
    foreign = out_dir.exists() and any(out_dir.iterdir()) and read_marker(out_dir) is None
    if foreign and not args.force:
        print(f"{out_dir} is not empty and has no {MARKER}; use --force to write into it", file=sys.stderr)
        return 1
    write_spark_checkpoint(out_dir, args.preset, args.seed)
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size:>14,d}  {path}")
    print(f"wrote a synthetic Spark-TTS checkpoint (preset={args.preset}, seed={args.seed}) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
