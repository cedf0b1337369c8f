"""The files of the `SparkAudio/Spark-TTS-0.5B` hub repository that the toolkit reads."""

from __future__ import annotations

from pathlib import Path

HF_REPO = "SparkAudio/Spark-TTS-0.5B"
MODELSCOPE_REPO = "SparkAudio/Spark-TTS-0.5B"

REQUIRED_FILES = (
    "config.yaml",
    "BiCodec/config.yaml",
    "BiCodec/model.safetensors",
    "wav2vec2-large-xlsr-53/config.json",
    "wav2vec2-large-xlsr-53/preprocessor_config.json",
    "LLM/config.json",
    "LLM/tokenizer.json",
    "LLM/tokenizer_config.json",
)
WAV2VEC2_WEIGHTS = ("pytorch_model.bin", "model.safetensors")
LLM_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")


def missing_files(model_dir: str | Path) -> list[str]:
    """The files a Spark-TTS checkpoint directory lacks; empty when it is complete."""
    model_dir = Path(model_dir)
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if not any((model_dir / "wav2vec2-large-xlsr-53" / w).is_file() for w in WAV2VEC2_WEIGHTS):
        missing.append("wav2vec2-large-xlsr-53/{" + ",".join(WAV2VEC2_WEIGHTS) + "}")
    if not any((model_dir / "LLM" / w).is_file() for w in LLM_WEIGHTS):
        missing.append("LLM/{" + ",".join(LLM_WEIGHTS) + "}")
    return missing
