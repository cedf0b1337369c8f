"""A whole synthetic CosyVoice3 deployment: `Fun-CosyVoice3-0.5B-2512/` and `hf_cosyvoice3_llm/`, laid out like
the hub repositories, with random weights. The HF LLM is made from `llm.pt` + `CosyVoice-BlankEN/` by our
converter, as upstream's runtime is given it; speaker "001" of spk2info.pt is what the synthetic front end
makes of a waveform (the caller's recording, or a voiced test signal)."""

from __future__ import annotations

from pathlib import Path

from tritontts.cosyvoice2.spk2info import SPK2INFO_FILE
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR, missing_files
from tritontts.synthetic import cosyvoice2 as cv2_checkpoint
from tritontts.synthetic.cosyvoice2 import (
    MARKER,
    PRESETS,
    VOICE_TEXT,
    finish_checkpoint,
    read_marker,
    save_speaker,
    voice_wav,
)

__all__ = ["MARKER", "PRESETS", "is_complete", "read_marker", "write_cosyvoice3_checkpoint"]


def is_complete(out_dir: str | Path, preset: str, seed: int) -> bool:
    return cv2_checkpoint.is_complete(out_dir, preset, seed, "cosyvoice3", missing_files)


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
    from tritontts.cosyvoice3.convert import convert_cosyvoice3_llm
    from tritontts.cosyvoice3.frontend import cosyvoice3_frontend
    from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
    from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files

    root = Path(out_dir)
    model_dir = write_cosyvoice3_token2wav(root / MODEL_DIR, preset, seed)
    write_cosyvoice3_llm_files(model_dir, preset, seed)
    convert_cosyvoice3_llm(model_dir, root / LLM_DIR, "bfloat16")
    features = cosyvoice3_frontend(model_dir)(voice_wav(prompt_wav, seed))
    save_speaker(model_dir / SPK2INFO_FILE, features, prompt_text, root / LLM_DIR)
    finish_checkpoint(root, missing_files(root), "cosyvoice3", preset, seed)
    return root
