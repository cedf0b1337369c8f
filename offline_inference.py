#!/usr/bin/env python3
"""Benchmark a whole TTS pipeline in one process, no server: Spark-TTS (audio tokenizer → LLM → vocoder),
CosyVoice2 (front end → LLM → token2wav) or CosyVoice2-DiT (the same LLM, Step-Audio-2-mini's DiT token2wav).

    python offline_inference.py --model-dir Spark-TTS-0.5B --huggingface-dataset exp/bench_data \
        --split-name wenetspeech4tts --backend torch --batch-sizes 1,2,4,8,16 --log-dir exp/offline
    python offline_inference.py --model cosyvoice2 --model-dir exp/cosyvoice2/checkpoint \
        --huggingface-dataset yuekai/seed_tts_cosy2 --split-name wenetspeech4tts --log-dir exp/offline
    python offline_inference.py --model cosyvoice2_dit --model-dir exp/cosyvoice2_dit/checkpoint \
        --backend openai --llm-endpoint http://localhost:8000/v1/chat/completions \
        --huggingface-dataset yuekai/seed_tts_cosy2 --split-name wenetspeech4tts --log-dir exp/offline

Backends: torch, hf, trtllm (in this process) and, for the CosyVoice2 models, openai (alias trtllm-serve): an
OpenAI-compatible /v1/chat/completions at --llm-endpoint (trtllm-serve, or python -m
tritontts.llm.openai_server), one non-streamed request per row, a batch's requests in flight together.

For each batch size the rows are grouped into batches; each batch's stages are timed on their own (the LLM
generates all prompts of a batch together). The first batch of each batch size is first run once as a
warm-up, timed apart and excluded from the totals. Writes every WAV to LOG_DIR/<backend>_bs<N>/<id>.wav,
LOG_DIR/offline_<backend>.json and .md (other models: offline_<model>_<backend>.json and .md), and prints
the table.

--realistic-lengths makes every row generate exactly as many tokens as its target text's expected duration
needs (50 per second for Spark-TTS, 25 for CosyVoice2; for synthetic checkpoints, which may not stop by
themselves); otherwise --max-new-tokens caps generation (default 1500 for Spark-TTS, 750 for CosyVoice2, as
upstream) and the end token stops it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritontts.bench.dataset import DatasetError, load_utterances
from tritontts.bench.offline import run_offline
from tritontts.bench.offline_llm import TRTLLM_MISSING, trtllm_available
from tritontts.bench.offline_report import markdown_table, write_outputs
from tritontts.bench.offline_settings import (
    BACKEND_ALIASES,
    BACKENDS,
    MISSING_ENDPOINT,
    MODELS,
    TOKEN2WAV_DTYPES,
    BackendUnavailable,
    LLMEndpointError,
    OfflineSettings,
    backend_name,
)


def batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"batch sizes must be comma-separated integers, got {text!r}"
        ) from err
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {text!r}")
    return sizes


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="spark_tts", help="which TTS pipeline")
    p.add_argument(
        "--model-dir",
        required=True,
        help="spark_tts: the checkpoint (config.yaml, BiCodec/, LLM/, ...); cosyvoice2: the folder holding "
        "CosyVoice2-0.5B/ and cosyvoice2_llm/; cosyvoice2_dit: those and Step-Audio-2-mini/token2wav/; cosyvoice3: "
        "Fun-CosyVoice3-0.5B-2512/ and hf_cosyvoice3_llm/",
    )
    p.add_argument(
        "--huggingface-dataset",
        default="yuekai/seed_tts",
        help="hub name, save_to_disk dir, parquet file or dir, or manifest",
    )
    p.add_argument("--split-name", default="wenetspeech4tts", help="dataset split")
    p.add_argument(
        "--backend",
        type=backend_name,
        choices=BACKENDS,
        default="torch",
        help=f"LLM backend ({', '.join(f'{a} = {b}' for a, b in BACKEND_ALIASES.items())})",
    )
    p.add_argument("--batch-sizes", type=batch_sizes, default=(1, 2, 4, 8, 16), help="e.g. 1,2,4,8,16")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument(
        "--dtype", choices=["auto", "bfloat16", "float32"], default="auto", help="LLM dtype (codec: float32)"
    )
    p.add_argument("--log-dir", default="exp/offline", help="where the WAVs, JSON and table go")
    p.add_argument("--compile", action="store_true", help="torch.compile the LLM's decode step (torch, hf)")
    p.add_argument(
        "--token2wav-dtype",
        choices=TOKEN2WAV_DTYPES,
        default="auto",
        help="cosyvoice2(_dit) flow dtype; auto: float16 on CUDA, float32 on CPU (HiFT: float32)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="generation cap without --realistic-lengths (default 1500 spark_tts, 750 cosyvoice2)",
    )
    p.add_argument(
        "--realistic-lengths",
        action="store_true",
        help="generate exactly 50 (spark_tts) or 25 (cosyvoice2) tokens per expected second of each target text",
    )
    p.add_argument("--limit-rows", type=int, default=None, help="use only the first N rows")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument(
        "--max-seq-len", type=int, default=None, help="torch engine KV length (default: fit the longest row)"
    )
    p.add_argument("--engine-dir", default=None, help="trtllm: the TensorRT-LLM engine directory")
    p.add_argument(
        "--llm-endpoint",
        default=None,
        help="openai: URL of the LLM's /v1/chat/completions (a bare http://host:port gets that path)",
    )
    p.add_argument(
        "--llm-model", default="trt_engines_bfloat16", help="openai: the requests' model name (upstream's)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    if args.backend == "trtllm" and not trtllm_available():
        print(f"error: {TRTLLM_MISSING}", file=sys.stderr)
        return 2
    if args.backend == "openai" and not args.llm_endpoint:
        print(f"error: {MISSING_ENDPOINT}", file=sys.stderr)
        return 2
    settings = OfflineSettings(
        model=args.model,
        model_dir=Path(args.model_dir),
        backend=args.backend,
        batch_sizes=args.batch_sizes,
        device=args.device,
        dtype=args.dtype,
        compile=args.compile,
        max_new_tokens=args.max_new_tokens,
        realistic_lengths=args.realistic_lengths,
        seed=args.seed,
        max_seq_len=args.max_seq_len,
        engine_dir=Path(args.engine_dir) if args.engine_dir else None,
        token2wav_dtype=args.token2wav_dtype,
        llm_endpoint=args.llm_endpoint,
        llm_model=args.llm_model,
    )
    try:
        rows = load_utterances(args.huggingface_dataset, args.split_name)
        if args.limit_rows is not None:
            rows = rows[: args.limit_rows]
        report = run_offline(settings, rows, Path(args.log_dir))
    except BackendUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except (DatasetError, ValueError, FileNotFoundError, LLMEndpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    paths = write_outputs(report, Path(args.log_dir))
    print(markdown_table(report), end="")
    print(f"wrote {paths['json']} and {paths['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
