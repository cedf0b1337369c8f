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

LLM_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def required_files(model_dir: str, llm_dir: str, config_file: str, speech_tokenizer: str) -> tuple[str, ...]:
    """The files a CosyVoice deployment serves from (CosyVoice2's and CosyVoice3's differ by these names)."""
    return (
        f"{model_dir}/{config_file}",
        f"{model_dir}/flow.pt",
        f"{model_dir}/hift.pt",
        f"{model_dir}/campplus.onnx",
        f"{model_dir}/{speech_tokenizer}",
        f"{llm_dir}/config.json",
        f"{llm_dir}/tokenizer.json",
        f"{llm_dir}/tokenizer_config.json",
    )


REQUIRED_FILES = required_files(MODEL_DIR, LLM_DIR, "cosyvoice2.yaml", "speech_tokenizer_v2.onnx")


def missing_files(
    root: str | Path, required: tuple[str, ...] = REQUIRED_FILES, llm_dir: str = LLM_DIR
) -> list[str]:
    """What `root` (holding both directories) lacks for serving; empty when complete."""
    root = Path(root)
    missing = [name for name in required if not (root / name).is_file()]
    if not any((root / llm_dir / w).is_file() for w in LLM_WEIGHTS):
        missing.append(f"{llm_dir}/{{" + ",".join(LLM_WEIGHTS) + "}")
    return missing
