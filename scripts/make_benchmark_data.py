#!/usr/bin/env python3
"""Write a small benchmark set in the `yuekai/seed_tts` schema, for when the hub cannot be reached.

    python scripts/make_benchmark_data.py --output-dir exp/bench_data
    python client_grpc.py --huggingface-dataset exp/bench_data --split-name wenetspeech4tts ...

Rows pair prompt voices with Chinese and English target texts: the Mandarin prompt WAV given by --prompt-wav
and, when `espeak-ng` is installed, English prompts it synthesizes. Writes `manifest.txt` + `wavs/` (always;
also loadable with --manifest-path), and, when the `datasets` package imports, `hf/` (save_to_disk) and
`parquet/<split>.parquet`.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import soundfile

from tritontts.bench.dataset import DatasetError, Utterance, write_hf_copies, write_manifest

ZH_PROMPT_TEXT = (
    "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。"
    "豆奶牛奶换着喝，营养更均衡，本节目由豆本豆豆奶特约播出。"
)
ESPEAK_PROMPTS = {
    "en_us": ("en-us", "The quick brown fox jumps over the lazy dog, and then it runs back into the forest."),
    "en_gb": ("en-gb", "Please call Stella and ask her to bring these things with her from the store."),
}
TARGET_TEXTS = (
    "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。",
    "Speech synthesis turns written words into natural sounding audio.",
    "今天天气很好，我们一起去公园散步吧。",
    "The meeting has been moved to Thursday afternoon at three o'clock.",
    "人工智能正在改变我们的生活方式和工作方式。",
    "Streaming lets the listener hear the first words before the sentence is finished.",
    "请在下一个路口右转，然后沿着河边一直往前走。",
    "A good benchmark measures latency, throughput and quality together.",
    "这本书的内容非常有趣，我推荐大家都去读一读。",
    "She sells sea shells by the sea shore, and the shells she sells are surely sea shells.",
    "火车将在十分钟后到站，请乘客们做好下车准备。",
    "Thank you for calling. Your order will arrive within two business days.",
    "春天来了，花园里开满了五颜六色的花。",
)


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output-dir", default="exp/bench_data", help="where the dataset is written")
    p.add_argument("--prompt-wav", default="../shared/data/prompt_zh.wav", help="the Mandarin prompt voice")
    p.add_argument("--prompt-text", default=ZH_PROMPT_TEXT, help="the transcript of --prompt-wav")
    p.add_argument("--split-name", default="wenetspeech4tts", help="split name the rows are saved under")
    p.add_argument("--num-rows", type=int, default=26, help="rows to write (26, like the upstream benchmark)")
    p.add_argument("--no-espeak", action="store_true", help="do not add English prompts made with espeak-ng")
    p.add_argument("--manifest-only", action="store_true", help="skip the save_to_disk and parquet copies")
    return p


def espeak_prompt(voice: str, text: str) -> tuple:
    """Samples and rate of `text` spoken by espeak-ng's `voice`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prompt.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True)
        wav, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return wav[:, 0], int(rate)


def prompt_voices(prompt_wav: Path, prompt_text: str, use_espeak: bool) -> list[tuple[str, object, int, str]]:
    """(name, samples, rate, transcript) of every prompt voice."""
    wav, rate = soundfile.read(prompt_wav, dtype="float32", always_2d=True)
    voices = [("zh", wav[:, 0], int(rate), prompt_text)]
    if use_espeak and shutil.which("espeak-ng"):
        for name, (voice, text) in ESPEAK_PROMPTS.items():
            samples, espeak_rate = espeak_prompt(voice, text)
            voices.append((name, samples, espeak_rate, text))
    return voices


def build_rows(voices: Sequence[tuple], num_rows: int) -> list[Utterance]:
    """Row i pairs voice i mod len(voices) with target text i mod len(TARGET_TEXTS)."""
    rows = []
    for i in range(num_rows):
        name, samples, rate, transcript = voices[i % len(voices)]
        rows.append(
            Utterance(f"{i:03d}_{name}", transcript, samples, rate, TARGET_TEXTS[i % len(TARGET_TEXTS)])
        )
    return rows


def make_benchmark_data(args: argparse.Namespace) -> dict[str, Path]:
    output_dir = Path(args.output_dir)
    rows = build_rows(
        prompt_voices(Path(args.prompt_wav), args.prompt_text, not args.no_espeak), args.num_rows
    )
    written = {"manifest": write_manifest(rows, output_dir)}
    if not args.manifest_only:
        try:
            written |= write_hf_copies(rows, output_dir, args.split_name)
        except DatasetError as error:
            print(f"warning: only the manifest was written: {error}", file=sys.stderr)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    if not Path(args.prompt_wav).is_file():
        print(f"error: prompt WAV {args.prompt_wav} not found (see --prompt-wav)", file=sys.stderr)
        return 2
    written = make_benchmark_data(args)
    voices = "with" if shutil.which("espeak-ng") and not args.no_espeak else "without"
    print(f"wrote {args.num_rows} rows ({voices} espeak-ng English prompts):")
    for kind, path in written.items():
        print(f"  {kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
