#!/usr/bin/env python3
"""Stage 0: put a model checkpoint in place, from the HF hub, ModelScope, the synthetic generator or a local dir."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritontts.cosyvoice2 import layout as cosyvoice2_layout
from tritontts.cosyvoice3 import layout as cosyvoice3_layout
from tritontts.dit_token2wav import layout as dit_layout
from tritontts.spark import layout as spark_layout

LAYOUTS = {
    "spark_tts": spark_layout,
    "cosyvoice2": cosyvoice2_layout,
    "cosyvoice2_dit": dit_layout,
    "cosyvoice3": cosyvoice3_layout,
}
OFFLINE_HINT = (
    "No network? Use --model_source synthetic-tiny (or synthetic-full) to write a synthetic checkpoint."
)


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def download_huggingface(repo: str, out: Path, patterns: list[str] | None = None) -> None:
    from huggingface_hub import snapshot_download

    # Resumes interrupted downloads and shows a tqdm bar per file.
    snapshot_download(repo_id=repo, local_dir=str(out), allow_patterns=patterns)


def download_modelscope(repo: str, out: Path) -> None:
    from modelscope import snapshot_download

    snapshot_download(repo, local_dir=str(out))


def download_file(url: str, path: Path) -> None:
    """Fetch `url` to `path` through a `.part` file that a later run continues (HTTP Range)."""
    import urllib.request

    part = path.with_name(path.name + ".part")
    done = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={done}-"} if done else {})
    with urllib.request.urlopen(request, timeout=60) as response:
        mode = "ab" if done and response.status == 206 else "wb"
        with open(part, mode) as f:
            while chunk := response.read(1 << 20):
                f.write(chunk)
    part.replace(path)


def download_cosyvoice2(source: str, out: Path) -> None:
    """Both repositories into `out/CosyVoice2-0.5B` and `out/cosyvoice2_llm`, then the optional spk2info.pt."""
    layout = cosyvoice2_layout
    repos = layout.HF_REPOS if source == "huggingface" else layout.MODELSCOPE_REPOS
    for directory, repo in repos.items():
        print(f"downloading {repo} from {source} into {out / directory}")
        (download_huggingface if source == "huggingface" else download_modelscope)(repo, out / directory)
    spk2info = out / layout.MODEL_DIR / "spk2info.pt"
    if not spk2info.exists():
        try:
            download_file(layout.SPK2INFO_URL, spk2info)
        except OSError as err:
            print(f"warning: no {spk2info} (cached speakers; requests then need reference audio): {err}")


def download_dit_token2wav(out: Path) -> None:
    """Step-Audio-2-mini's token2wav files into `out/Step-Audio-2-mini/token2wav` (from the HF hub, as upstream)."""
    target = out / dit_layout.STEP_AUDIO_DIR
    print(f"downloading {dit_layout.STEP_AUDIO_REPO} (token2wav/ only) from huggingface into {target}")
    download_huggingface(dit_layout.STEP_AUDIO_REPO, target, ["token2wav/*"])


def download_cosyvoice3(source: str, out: Path) -> None:
    """`FunAudioLLM/Fun-CosyVoice3-0.5B-2512` and its LLM in the HF layout (`yuekai/...-LLM-HF`), as upstream's
    run_cosyvoice3.sh stage 0 (its third repository, FP16 ONNX for TensorRT, is not used here). HF hub only."""
    if source != "huggingface":
        fail("cosyvoice3 is downloaded from the huggingface hub only (as upstream's run_cosyvoice3.sh)")
    for directory, repo in cosyvoice3_layout.HF_REPOS.items():
        print(f"downloading {repo} from huggingface into {out / directory}")
        download_huggingface(repo, out / directory)


SYNTHETIC_MARKER = ".synthetic.json"  # what stage 0 wrote here: a rerun with the same one skips it


def write_synthetic(model: str, preset: str, out: Path, seed: int) -> None:
    if model == "spark_tts":
        from tritontts.synthetic.spark import write_spark_checkpoint

        write_spark_checkpoint(out, preset=preset, seed=seed)
    elif model in ("cosyvoice2", "cosyvoice2_dit"):
        from tritontts.synthetic.cosyvoice2 import write_cosyvoice2_checkpoint

        write_cosyvoice2_checkpoint(out, preset=preset, seed=seed)
        if model == "cosyvoice2_dit":
            from tritontts.synthetic.dit_token2wav import write_dit_token2wav

            write_dit_token2wav(out / dit_layout.TOKEN2WAV_DIR, preset=preset, seed=seed)
    elif model == "cosyvoice3":
        from tritontts.synthetic.cosyvoice3_checkpoint import write_cosyvoice3_checkpoint

        write_cosyvoice3_checkpoint(out, preset=preset, seed=seed)
    else:
        fail(f"no synthetic generator for model {model}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="spark_tts", choices=sorted(LAYOUTS))
    parser.add_argument(
        "--model_source",
        default="huggingface",
        help="huggingface | modelscope | synthetic-tiny | synthetic-full | a local checkpoint directory",
    )
    parser.add_argument(
        "--output_dir",
        type=Path,
        help="where hub and synthetic checkpoints go (not used for a local dir); "
        "for cosyvoice2 it receives CosyVoice2-0.5B/ and cosyvoice2_llm/, for cosyvoice2_dit also "
        "Step-Audio-2-mini/token2wav/, for cosyvoice3 Fun-CosyVoice3-0.5B-2512/ and hf_cosyvoice3_llm/",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    layout = LAYOUTS[args.model]
    out: Path = args.output_dir
    source: str = args.model_source

    if out is None and not Path(source).is_dir():
        fail("--output_dir is required unless --model_source is a local directory")
    if source.startswith("synthetic-"):
        marker = out / SYNTHETIC_MARKER
        written = {"model": args.model, "preset": source.removeprefix("synthetic-"), "seed": args.seed}
        if marker.is_file() and json.loads(marker.read_text()) == written and not layout.missing_files(out):
            print(
                f"{out} holds the synthetic {args.model} checkpoint ({written['preset']}, seed {args.seed}); "
                "nothing to write"
            )
            return
        write_synthetic(args.model, written["preset"], out, args.seed)
        marker.write_text(json.dumps(written))
    elif source in ("huggingface", "modelscope"):
        if not layout.missing_files(out):
            print(f"{out} is complete; nothing to download")
            return
        try:
            if args.model == "cosyvoice3":
                download_cosyvoice3(source, out)
            elif args.model in ("cosyvoice2", "cosyvoice2_dit"):
                if cosyvoice2_layout.missing_files(out):
                    download_cosyvoice2(source, out)
                if args.model == "cosyvoice2_dit":
                    download_dit_token2wav(out)
            else:
                repo = layout.HF_REPO if source == "huggingface" else layout.MODELSCOPE_REPO
                print(f"downloading {repo} from {source} into {out}")
                (download_huggingface if source == "huggingface" else download_modelscope)(repo, out)
        except Exception as err:  # noqa: BLE001 - any failure of the hub client ends here, explained
            fail(f"download from {source} failed: {type(err).__name__}: {err}\n{OFFLINE_HINT}")
    else:
        out = Path(source)
        if not out.is_dir():
            fail(f"--model_source {source!r} is neither a known source nor a directory. {OFFLINE_HINT}")

    missing = layout.missing_files(out)
    if missing:
        fail(f"{out} is not a complete {args.model} checkpoint; missing: {', '.join(missing)}")
    print(f"{args.model} checkpoint ready at {out}")


if __name__ == "__main__":
    main()
