"""The two directories a CosyVoice3 deployment reads, as upstream's run_cosyvoice3.sh names them.

`Fun-CosyVoice3-0.5B-2512/` (hub `FunAudioLLM/Fun-CosyVoice3-0.5B-2512`) holds the yaml, the front end, flow,
HiFT and the LLM as trained (`llm.pt` + `CosyVoice-BlankEN/`); `hf_cosyvoice3_llm/` (hub
`yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF`, or `python -m tritontts.cosyvoice3.convert`) is the LLM as one Hugging
Face Qwen2 with the speech tokens in its vocabulary.
"""

from __future__ import annotations

from pathlib import Path

from tritontts.cosyvoice2 import layout as cv2_layout
from tritontts.cosyvoice2.layout import required_files

MODEL_DIR = "Fun-CosyVoice3-0.5B-2512"
LLM_DIR = "hf_cosyvoice3_llm"
HF_REPOS = {
    MODEL_DIR: "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    LLM_DIR: "yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF",
}
REQUIRED_FILES = required_files(MODEL_DIR, LLM_DIR, "cosyvoice3.yaml", "speech_tokenizer_v3.onnx")


def missing_files(root: str | Path) -> list[str]:
    """What `root` (holding both directories) lacks for serving; empty when complete."""
    return cv2_layout.missing_files(root, REQUIRED_FILES, LLM_DIR)
