"""What a CosyVoice2-DiT deployment reads: the CosyVoice2 folders (the LLM, and the 25 Hz speech tokenizer that
makes the LLM's prompt) and the token2wav folder of Step-Audio-2-mini, as upstream's run script downloads them.

`Step-Audio-2-mini/token2wav/` comes from the hub repository `stepfun-ai/Step-Audio-2-mini` (only its
`token2wav/` files are fetched).
"""

from __future__ import annotations

from pathlib import Path

from tritontts.cosyvoice2 import layout as cosyvoice2_layout

STEP_AUDIO_DIR = "Step-Audio-2-mini"
TOKEN2WAV_DIR = f"{STEP_AUDIO_DIR}/token2wav"
STEP_AUDIO_REPO = "stepfun-ai/Step-Audio-2-mini"
TOKEN2WAV_FILES = ("flow.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2_25hz.onnx")
REQUIRED_FILES = (*cosyvoice2_layout.REQUIRED_FILES, *(f"{TOKEN2WAV_DIR}/{name}" for name in TOKEN2WAV_FILES))


def missing_files(root: str | Path) -> list[str]:
    """What `root` (holding the three folders) lacks for serving; empty when complete."""
    root = Path(root)
    dit = [
        f"{TOKEN2WAV_DIR}/{name}" for name in TOKEN2WAV_FILES if not (root / TOKEN2WAV_DIR / name).is_file()
    ]
    return cosyvoice2_layout.missing_files(root) + dit
