"""A whole synthetic CosyVoice3 deployment: `Fun-CosyVoice3-0.5B-2512/` and `hf_cosyvoice3_llm/`, laid out like
the hub repositories, with random weights. The HF LLM is made from `llm.pt` + `CosyVoice-BlankEN/` by our
converter, as upstream's runtime is given it; speaker "001" of spk2info.pt is what the synthetic front end
makes of a waveform (the caller's recording, or a voiced test signal)."""

from __future__ import annotations

import json
from pathlib import Path

from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, SPK2INFO_FILE, CachedSpeaker, save_spk2info
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR, missing_files
from tritontts.synthetic.cosyvoice2 import MARKER, PRESETS, VOICE_SAMPLE_RATE, VOICE_TEXT, voiced_signal

__all__ = ["MARKER", "PRESETS", "is_complete", "read_marker", "write_cosyvoice3_checkpoint"]


def read_marker(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


def is_complete(out_dir: str | Path, preset: str, seed: int) -> bool:
    marker = read_marker(out_dir)
    same = marker is not None and marker.get("model") == "cosyvoice3"
    same = same and marker.get("preset") == preset and marker.get("seed") == seed
    return same and not missing_files(out_dir)


def write_cosyvoice3_checkpoint(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    prompt_wav: str | Path | None = None,
    prompt_text: str = VOICE_TEXT,
) -> Path:
    """Write `<out_dir>/Fun-CosyVoice3-0.5B-2512/` (cosyvoice3.yaml, flow.pt, hift.pt, campplus.onnx,
    speech_tokenizer_v3.onnx, llm.pt, CosyVoice-BlankEN/, spk2info.pt), `<out_dir>/hf_cosyvoice3_llm/` and the
    SYNTHETIC.json marker; returns `out_dir`."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {PRESETS}")
    from tritontts.audio import load_wav
    from tritontts.cosyvoice3.convert import convert_cosyvoice3_llm
    from tritontts.cosyvoice3.frontend import cosyvoice3_frontend
    from tritontts.spark.prompt import load_llm_tokenizer
    from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
    from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files

    root = Path(out_dir)
    model_dir = write_cosyvoice3_token2wav(root / MODEL_DIR, preset, seed)
    write_cosyvoice3_llm_files(model_dir, preset, seed)
    convert_cosyvoice3_llm(model_dir, root / LLM_DIR, "bfloat16")
    wav = voiced_signal(seed=seed) if prompt_wav is None else load_wav(prompt_wav, VOICE_SAMPLE_RATE)
    features = cosyvoice3_frontend(model_dir)(wav)
    text_tokens = load_llm_tokenizer(root / LLM_DIR).encode(prompt_text).ids
    speaker = CachedSpeaker.from_features(features, prompt_text, text_tokens)
    save_spk2info(model_dir / SPK2INFO_FILE, {DEFAULT_SPEAKER: speaker})
    missing = missing_files(root)
    if missing:
        raise RuntimeError(f"synthetic checkpoint in {root} is incomplete: {', '.join(missing)}")
    marker = {
        "model": "cosyvoice3",
        "preset": preset,
        "seed": seed,
        "note": "random weights, not a trained model",
    }
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return root
