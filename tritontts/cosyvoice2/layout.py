"""The two directories a CosyVoice2 deployment reads, as upstream's run.sh downloads them.

`CosyVoice2-0.5B/` (hub `FunAudioLLM/CosyVoice2-0.5B`, ModelScope `iic/CosyVoice2-0.5B`) holds the front end,
flow and HiFT; `cosyvoice2_llm/` (hub `yuekai/cosyvoice2_llm`) is the LLM as a Hugging Face Qwen2. The optional
`spk2info.pt` (cached speakers) comes from the async_cosyvoice repository on GitHub.
"""

from __future__ import annotations

from pathlib import Path

MODEL_DIR = "CosyVoice2-0.5B"
LLM_DIR = "cosyvoice2_llm"
HF_REPOS = {MODEL_DIR: "FunAudioLLM/CosyVoice2-0.5B", LLM_DIR: "yuekai/cosyvoice2_llm"}
# The LLM's ModelScope copy is named in third-party guides only; upstream downloads it from the HF hub.
MODELSCOPE_REPOS = {MODEL_DIR: "iic/CosyVoice2-0.5B", LLM_DIR: "yuekai/cosyvoice2_llm"}
SPK2INFO_URL = "https://raw.githubusercontent.com/qi-hua/async_cosyvoice/main/CosyVoice2-0.5B/spk2info.pt"

REQUIRED_FILES = (
    f"{MODEL_DIR}/cosyvoice2.yaml",
    f"{MODEL_DIR}/flow.pt",
    f"{MODEL_DIR}/hift.pt",
    f"{MODEL_DIR}/campplus.onnx",
    f"{MODEL_DIR}/speech_tokenizer_v2.onnx",
    f"{LLM_DIR}/config.json",
    f"{LLM_DIR}/tokenizer.json",
    f"{LLM_DIR}/tokenizer_config.json",
)
LLM_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def missing_files(root: str | Path) -> list[str]:
    """What `root` (holding both directories) lacks for serving; empty when complete."""
    root = Path(root)
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if not any((root / LLM_DIR / w).is_file() for w in LLM_WEIGHTS):
        missing.append(f"{LLM_DIR}/{{" + ",".join(LLM_WEIGHTS) + "}")
    return missing
