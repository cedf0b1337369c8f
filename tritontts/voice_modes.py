"""Command-line flags for the BLS voice modes, shared by client_grpc.py and client_http.py.

`--gender/--pitch/--speed`: Spark-TTS voice creation (no reference is sent); `--instruct-text`: CosyVoice2's
instruct2 mode; `--cross-lingual`: CosyVoice2's cross_lingual mode (the reference without its transcript).
"""

from __future__ import annotations

import argparse

import numpy as np

LEVELS = ("very_low", "low", "moderate", "high", "very_high")


def add_mode_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("voice modes (optional BLS inputs)")
    group.add_argument("--gender", choices=("female", "male"), default=None, help="Spark-TTS voice creation")
    group.add_argument("--pitch", choices=LEVELS, default=None, help="Spark-TTS voice creation's pitch level")
    group.add_argument("--speed", choices=LEVELS, default=None, help="Spark-TTS voice creation's speed level")
    group.add_argument(
        "--instruct-text", default=None, help="CosyVoice2 instruct2, e.g. '用四川话说这句话<|endofprompt|>'"
    )
    group.add_argument(
        "--cross-lingual",
        action="store_true",
        help="CosyVoice2 cross_lingual: the reference without transcript",
    )


def _text(value: str) -> np.ndarray:
    return np.array([[value.encode("utf-8")]], dtype=object)


def mode_parameters(args: argparse.Namespace) -> dict:
    """The request parameters of the chosen mode (none without a mode flag)."""
    if args.gender:
        return {}
    if args.instruct_text is not None:
        return {"mode": "instruct2"}
    return {"mode": "cross_lingual"} if args.cross_lingual else {}


def mode_arrays(args: argparse.Namespace, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request's inputs for the chosen mode (unchanged without a mode flag)."""
    if (args.pitch or args.speed) and not args.gender:
        raise ValueError("--pitch and --speed are voice creation's: give --gender too")
    if args.gender:
        voice = {"gender": args.gender, "pitch": args.pitch or "moderate", "speed": args.speed or "moderate"}
        return {"target_text": arrays["target_text"]} | {k: _text(v) for k, v in voice.items()}
    if args.instruct_text is not None:
        kept = {k: v for k, v in arrays.items() if k != "reference_text"}
        return kept | {"instruct_text": _text(args.instruct_text)}
    if args.cross_lingual:
        return {k: v for k, v in arrays.items() if k != "reference_text"}
    return arrays
