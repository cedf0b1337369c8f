"""Write a Spark-TTS-0.5B, CosyVoice2 or CosyVoice3 checkpoint directory with random weights, for tests and demos
without downloads. For cosyvoice2, the output directory receives CosyVoice2-0.5B/ and cosyvoice2_llm/; for
cosyvoice3, Fun-CosyVoice3-0.5B-2512/ and hf_cosyvoice3_llm/."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritontts.synthetic import cosyvoice2, spark
from tritontts.synthetic import cosyvoice3_checkpoint as cosyvoice3
from tritontts.synthetic.spark import write_spark_checkpoint

GENERATORS = {"spark": spark, "cosyvoice2": cosyvoice2, "cosyvoice3": cosyvoice3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", choices=sorted(GENERATORS), default="spark")
    parser.add_argument(
        "--preset", choices=spark.PRESETS, default="tiny", help="tiny: small test sizes; full: real sizes"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--force", action="store_true", help="rewrite even when the directory is complete")
    parser.add_argument(
        "--prompt-wav",
        type=Path,
        help="cosyvoice2/3: the recording cached as speaker 001 of spk2info.pt (default: a voiced test signal)",
    )
    parser.add_argument("--prompt-text", help="cosyvoice2/3: the transcript of --prompt-wav")
    return parser.parse_args(argv)


def write(args: argparse.Namespace) -> None:
    if args.model == "spark":
        write_spark_checkpoint(args.output_dir, args.preset, args.seed)
        return
    prompt = {} if args.prompt_text is None else {"prompt_text": args.prompt_text}
    if args.model == "cosyvoice3":
        cosyvoice3.write_cosyvoice3_checkpoint(
            args.output_dir, args.preset, args.seed, prompt_wav=args.prompt_wav, **prompt
        )
        return
    cosyvoice2.write_cosyvoice2_checkpoint(
        args.output_dir, args.preset, args.seed, prompt_wav=args.prompt_wav, **prompt
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    generator = GENERATORS[args.model]
    out_dir: Path = args.output_dir
    if not args.force and generator.is_complete(out_dir, args.preset, args.seed):
        print(
            f"{out_dir} already holds a complete synthetic checkpoint (preset={args.preset}, seed={args.seed})"
        )
        return 0
    foreign = out_dir.exists() and any(out_dir.iterdir()) and generator.read_marker(out_dir) is None
    if foreign and not args.force:
        print(
            f"{out_dir} is not empty and has no {generator.MARKER}; use --force to write into it",
            file=sys.stderr,
        )
        return 1
    if (args.prompt_wav or args.prompt_text) and args.model == "spark":
        print("--prompt-wav and --prompt-text are for --model cosyvoice2 and cosyvoice3", file=sys.stderr)
        return 1
    write(args)
    for path in sorted(p for p in out_dir.rglob("*") if p.is_file()):
        print(f"{path.stat().st_size:>14,d}  {path}")
    name = {"spark": "Spark-TTS", "cosyvoice2": "CosyVoice2", "cosyvoice3": "CosyVoice3"}[args.model]
    print(f"wrote a synthetic {name} checkpoint (preset={args.preset}, seed={args.seed}) to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
