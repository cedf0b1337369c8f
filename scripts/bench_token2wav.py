#!/usr/bin/env python3
r"""Standalone token2wav benchmark: speech tokens → 24 kHz audio per dataset row, no LLM, no server.

    python scripts/bench_token2wav.py --model cosyvoice2_dit --model-dir exp/cosyvoice2_dit/checkpoint \
        --huggingface-dataset yuekai/seed_tts_cosy2 --split-name wenetspeech4tts --mode both \
        --log-dir exp/token2wav

--model-dir is the folder run.sh stage 0 writes (CosyVoice2-0.5B/ for cosyvoice2, Step-Audio-2-mini/token2wav/
for cosyvoice2_dit), or the model's folder itself. Target tokens are the rows' target_audio_cosy2_tokens when
the dataset has them (seed_tts_cosy2), else seeded random speech ids, 25 per expected second of the target
text. Speakers are prepared once per distinct prompt and mode, timed apart. Streaming makes the calls the
Triton BLS makes (--strategy, --token-hop-len, --pre-lookahead-len as its parameters). The first --warmup rows
are run once in each mode before measuring, not counted. Writes LOG_DIR/token2wav_<model>_<mode>.json and
.md (and with --save-wavs LOG_DIR/<model>_<mode>/<id>.wav), and prints the tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tritontts.bench.dataset import DatasetError, load_utterances
from tritontts.bench.offline_settings import TOKEN2WAV_DTYPES
from tritontts.bench.token2wav_bench import (
    MODES,
    STRATEGIES,
    BenchSettings,
    markdown,
    run_benchmark,
    write_report,
)
from tritontts.bench.token2wav_models import MODELS


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, required=True, help="which token2wav")
    p.add_argument("--model-dir", required=True, help="the checkpoint folder run.sh stage 0 writes")
    p.add_argument(
        "--huggingface-dataset",
        default="yuekai/seed_tts_cosy2",
        help="hub name, save_to_disk dir, parquet file or dir, or manifest",
    )
    p.add_argument("--split-name", default="wenetspeech4tts", help="dataset split")
    p.add_argument("--mode", choices=[*MODES, "both"], default="both")
    p.add_argument("--strategy", choices=STRATEGIES, default="exponential", help="streaming chunk sizes")
    p.add_argument("--token-hop-len", type=int, default=15, help="tokens of the first (fixed: every) chunk")
    p.add_argument("--pre-lookahead-len", type=int, default=3, help="look-ahead tokens; the model's own")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]")
    p.add_argument(
        "--dtype",
        choices=TOKEN2WAV_DTYPES,
        default="auto",
        help="flow dtype; auto: float16 on CUDA, else float32",
    )
    p.add_argument(
        "--cuda-graphs",
        choices=("auto", "true", "false"),
        default="auto",
        help="the flow decoder from CUDA graphs (auto: on CUDA); run once with each to compare",
    )
    p.add_argument("--warmup", type=int, default=2, help="rows run once per mode before measuring")
    p.add_argument("--max-rows", type=int, default=None, help="use only the first N rows")
    p.add_argument("--seed", type=int, default=0, help="synthetic tokens and HiFT noise")
    p.add_argument("--save-wavs", action="store_true", help="write every row's audio")
    p.add_argument("--log-dir", default="exp/token2wav", help="where the JSON, tables and WAVs go")
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    settings = BenchSettings(
        model=args.model,
        model_dir=Path(args.model_dir),
        modes=MODES if args.mode == "both" else (args.mode,),
        strategy=args.strategy,
        token_hop_len=args.token_hop_len,
        pre_lookahead_len=args.pre_lookahead_len,
        device=args.device,
        dtype=args.dtype,
        cuda_graphs=args.cuda_graphs,
        warmup=args.warmup,
        seed=args.seed,
        save_wavs=args.save_wavs,
    )
    try:
        rows = load_utterances(args.huggingface_dataset, args.split_name)
        if args.max_rows is not None:
            rows = rows[: args.max_rows]
        reports = run_benchmark(settings, rows, Path(args.log_dir))
    except (DatasetError, ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for report in reports:
        paths = write_report(report, Path(args.log_dir))
        print(markdown(report))
        print(f"wrote {paths['json']} and {paths['markdown']}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
