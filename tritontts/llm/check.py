"""run.sh stage 1 (torch backend): prove an LLM checkpoint loads strictly into our engine and runs.

python -m tritontts.llm.check --model_dir exp/spark_tts/checkpoint/LLM
"""

from __future__ import annotations

import argparse
import sys
import time

from tritontts.checkpoint import CheckpointError
from tritontts.llm.engine import LLMEngine
from tritontts.llm.loader import load_pretrained
from tritontts.llm.sequence import SamplingParams


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    try:
        model = load_pretrained(args.model_dir, device=args.device)
    except (CheckpointError, ValueError, OSError) as err:
        print(f"error: {args.model_dir} cannot be served by the torch engine: {err}", file=sys.stderr)
        return 1
    config = model.config
    engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, cuda_graphs=False)
    prompt = [i % config.vocab_size for i in range(100, 108)]
    tokens = engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))[0]
    if len(tokens) != 4:
        print(f"error: {args.model_dir}: the engine generated {tokens} instead of 4 tokens", file=sys.stderr)
        return 1
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.model_dir}: Qwen2 with {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"vocab {config.vocab_size}, {params / 1e6:.1f}M parameters; loaded and generated "
        f"in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
