"""A whole synthetic CosyVoice2 deployment: `CosyVoice2-0.5B/` and `cosyvoice2_llm/`, laid out like the hub
repositories, with random weights; speaker "001" of spk2info.pt is what the synthetic front end makes of a
waveform (the caller's recording, or a voiced test signal)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tritontts.cosyvoice2.layout import LLM_DIR, MODEL_DIR, missing_files
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, SPK2INFO_FILE, CachedSpeaker, save_spk2info

MARKER = "SYNTHETIC.json"
PRESETS = ("tiny", "full")
BLANK_EN_DIR = "CosyVoice-BlankEN"
LLM_PT = "llm.pt"
VOICE_SAMPLE_RATE = 16000
VOICE_SECONDS = 3.0
VOICE_TEXT = "希望你以后能够做的比我还好呦。"


@dataclass(frozen=True)
class Cosyvoice2Paths:
    root: Path
    model_dir: Path
    llm_dir: Path

    @property
    def spk2info(self) -> Path:
        return self.model_dir / SPK2INFO_FILE

    @property
    def llm_pt(self) -> Path:
        return self.model_dir / LLM_PT

    @property
    def blank_en(self) -> Path:
        return self.model_dir / BLANK_EN_DIR

    @classmethod
    def under(cls, root: str | Path) -> Cosyvoice2Paths:
        root = Path(root)
        return cls(root, root / MODEL_DIR, root / LLM_DIR)


def voiced_signal(seconds: float = VOICE_SECONDS, seed: int = 0) -> np.ndarray:
    """16 kHz float32 speech-like audio: a gliding harmonic source, syllable-rate envelope, a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * VOICE_SAMPLE_RATE)) / VOICE_SAMPLE_RATE
    f0 = 140 + 40 * np.sin(2 * np.pi * 0.7 * t + rng.uniform(0, np.pi))
    phase = 2 * np.pi * np.cumsum(f0) / VOICE_SAMPLE_RATE
    source = sum(np.sin(k * phase) / k for k in range(1, 16))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    wav = 0.2 * source * envelope + 0.005 * rng.standard_normal(t.size)
    return wav.astype(np.float32)


def write_spk2info(paths: Cosyvoice2Paths, wav_16k: np.ndarray, prompt_text: str) -> Path:
    """Speaker "001" from running the front end in `paths.model_dir` on `wav_16k` and its transcript."""
    from tritontts.cosyvoice2.frontend import CosyVoice2Frontend

    features = CosyVoice2Frontend.from_model_dir(paths.model_dir)(wav_16k)
    return save_speaker(paths.spk2info, features, prompt_text, paths.llm_dir)


def save_speaker(spk2info: Path, features: Any, prompt_text: str, llm_dir: Path) -> Path:
    """spk2info.pt holding speaker "001": the front end's `features` of a recording and its transcript,
    tokenized by the LLM's tokenizer."""
    from tritontts.spark.prompt import load_llm_tokenizer

    text_tokens = load_llm_tokenizer(llm_dir).encode(prompt_text).ids
    speaker = CachedSpeaker.from_features(features, prompt_text, text_tokens)
    return save_spk2info(spk2info, {DEFAULT_SPEAKER: speaker})


def voice_wav(prompt_wav: str | Path | None, seed: int) -> np.ndarray:
    """The recording speaker "001" is made from: `prompt_wav` at 16 kHz, or `voiced_signal(seed=seed)`."""
    from tritontts.audio import load_wav

    return voiced_signal(seed=seed) if prompt_wav is None else load_wav(prompt_wav, VOICE_SAMPLE_RATE)


def read_marker(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


def is_complete(
    out_dir: str | Path,
    preset: str,
    seed: int,
    model: str | None = None,
    missing: Callable[[str | Path], list[str]] = missing_files,
) -> bool:
    """The marker names this preset and seed (and `model`, when given) and no file is `missing`."""
    marker = read_marker(out_dir)
    same = marker is not None and marker.get("preset") == preset and marker.get("seed") == seed
    same = same and (model is None or marker.get("model") == model)
    return same and not missing(out_dir)


def finish_checkpoint(root: Path, missing: list[str], model: str, preset: str, seed: int) -> None:
    """Refuse an incomplete checkpoint; otherwise write its SYNTHETIC.json marker."""
    if missing:
        raise RuntimeError(f"synthetic checkpoint in {root} is incomplete: {', '.join(missing)}")
    marker = {"model": model, "preset": preset, "seed": seed, "note": "random weights, not a trained model"}
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def write_cosyvoice2_checkpoint(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    prompt_wav: str | Path | None = None,
    prompt_text: str = VOICE_TEXT,
) -> Cosyvoice2Paths:
    """Write `<out_dir>/CosyVoice2-0.5B/` (cosyvoice2.yaml, flow.pt, hift.pt, campplus.onnx,
    speech_tokenizer_v2.onnx, llm.pt, CosyVoice-BlankEN/, spk2info.pt), `<out_dir>/cosyvoice2_llm/` and the
    SYNTHETIC.json marker. Speaker "001" is made from `prompt_wav` (with its transcript `prompt_text`) or,
    without one, from `voiced_signal(seed=seed)`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {PRESETS}")
    from tritontts.synthetic.cosyvoice2_flow import write_flow
    from tritontts.synthetic.cosyvoice2_hift import write_hift
    from tritontts.synthetic.cosyvoice2_llm import (
        qwen2lm_state_dict,
        write_blank_en,
        write_cosyvoice2_llm,
        write_llm_pt,
    )
    from tritontts.synthetic.cosyvoice2_onnx import write_frontend_onnx

    paths = Cosyvoice2Paths.under(out_dir)
    write_flow(paths.model_dir, preset, seed)
    write_hift(paths.model_dir, preset, seed)
    write_frontend_onnx(paths.model_dir, preset, seed)
    qwen2lm = qwen2lm_state_dict(preset, seed)
    write_llm_pt(paths.llm_pt, qwen2lm)
    write_blank_en(paths.blank_en, preset, qwen2lm)
    write_cosyvoice2_llm(paths.llm_dir, preset, qwen2lm, seed)
    del qwen2lm
    write_spk2info(paths, voice_wav(prompt_wav, seed), prompt_text)
    finish_checkpoint(paths.root, missing_files(paths.root), "cosyvoice2", preset, seed)
    return paths
