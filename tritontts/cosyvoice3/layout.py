"""The two directories a CosyVoice3 deployment reads, as upstream's run_cosyvoice3.sh names them.

`Fun-CosyVoice3-0.5B-2512/` (hub `FunAudioLLM/Fun-CosyVoice3-0.5B-2512`) holds the yaml, the front end, flow,
HiFT and the LLM as trained (`llm.pt` + `CosyVoice-BlankEN/`); `hf_cosyvoice3_llm/` (hub
`yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF`, or `python -m tritontts.cosyvoice3.convert`) is the LLM as one Hugging
Face Qwen2 with the speech tokens in its vocabulary.
"""

from __future__ import annotations

from pathlib import Path

MODEL_DIR = "Fun-CosyVoice3-0.5B-2512"
LLM_DIR = "hf_cosyvoice3_llm"
HF_REPOS = {
    MODEL_DIR: "FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    LLM_DIR: "yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF",
}

REQUIRED_FILES = (
    f"{MODEL_DIR}/cosyvoice3.yaml",
    f"{MODEL_DIR}/flow.pt",
    f"{MODEL_DIR}/hift.pt",
    f"{MODEL_DIR}/campplus.onnx",
    f"{MODEL_DIR}/speech_tokenizer_v3.onnx",
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
