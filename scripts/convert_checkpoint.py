"""Convert an HF Qwen2 LLM directory (Spark-TTS `LLM/`) into a TensorRT-LLM checkpoint for `trtllm-build`."""

from __future__ import annotations

import argparse
import sys
import time

from tritontts.checkpoint import CheckpointError
from tritontts.trtllm.convert import ConvertOptions, convert_checkpoint


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model_dir", required=True, help="HF directory with config.json and the weights")
    parser.add_argument("--output_dir", default="tllm_checkpoint")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"])
    parser.add_argument("--tp_size", type=int, default=1, help="tensor-parallel ranks")
    parser.add_argument("--pp_size", type=int, default=1, choices=[1], help="pipeline parallelism: 1 only")
    parser.add_argument("--use_parallel_embedding", action="store_true", help="shard the embedding over tp")
    parser.add_argument("--embedding_sharding_dim", type=int, default=0, choices=[0, 1])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = ConvertOptions(
        dtype=args.dtype,
        tp_size=args.tp_size,
        pp_size=args.pp_size,
        use_parallel_embedding=args.use_parallel_embedding,
        embedding_sharding_dim=args.embedding_sharding_dim,
    )
    start = time.time()
    try:
        out = convert_checkpoint(args.model_dir, args.output_dir, options)
    except (CheckpointError, ValueError) as err:
        print(f"convert_checkpoint: {err}", file=sys.stderr)
        return 1
    print(f"wrote a TensorRT-LLM checkpoint (tp={args.tp_size}) to {out} in {time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
