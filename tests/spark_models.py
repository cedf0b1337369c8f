"""The Spark-TTS model repository of the test server: run.sh's stage-2 templates, filled by fill_template.py.

Both modes live on one server: `spark_tts` + `tensorrt_llm` are decoupled (streaming); `spark_tts_offline` +
`tensorrt_llm_offline` are not. They share `audio_tokenizer` and `vocoder`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tritontts.spark import tokens

ROOT = Path(__file__).resolve().parents[1]
FILL = ROOT / "scripts" / "fill_template.py"
TEMPLATES = ROOT / "model_repo"
COMMON = "triton_max_batch_size:16,max_queue_delay_microseconds:0"
STREAMING = "audio_chunk_duration:1.0,max_audio_chunk_duration:30.0,audio_chunk_size_scale_factor:2.0,audio_chunk_overlap_duration:0.1"
MAX_NEW_TOKENS = 120
LLM_SLOTS = 4  # engine slots of the decoupled tensorrt_llm


def install(template: str, repo: Path, name: str, values: str, templates: Path = TEMPLATES) -> Path:
    """Copy `templates/template` to `repo/name`, fill its config with `values` and rename the model `name`."""
    target = repo / name
    shutil.copytree(templates / template, target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.pbtxt"
    subprocess.run([sys.executable, str(FILL), "-i", str(config), values], check=True)
    text = re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.M)
    config.write_text(text)
    return target


def install_spark_bls(
    repo: Path,
    name: str,
    model_dir: Path,
    decoupled: bool,
    models: dict[str, str],
    instances: int = 2,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> Path:
    """The `spark_tts` BLS as model `name`, calling `models` ({role: model name}) in place of the roles' defaults."""
    path = install(
        "spark_tts",
        repo,
        name,
        f"bls_instance_num:{instances},llm_tokenizer_dir:{model_dir}/LLM,{COMMON},decoupled_mode:{decoupled},"
        f"{STREAMING},max_new_tokens:{max_new_tokens},max_text_length:300,text_normalization:false,"
        "max_reference_seconds:30",
    )
    config = path / "config.pbtxt"
    entries = "".join(
        f'  {{ key: "{role}_model", value: {{ string_value: "{m}" }} }},\n' for role, m in models.items()
    )
    config.write_text(
        config.read_text().replace('  { key: "voice_cache_size"', entries + '  { key: "voice_cache_size"')
    )
    return path


SPARK_SERVING = (
    "audio_tokenizer",
    "vocoder",
    "tensorrt_llm",
    "tensorrt_llm_offline",
    "spark_tts",
    "spark_tts_offline",
)
"""The models of Spark-TTS serving, streaming and offline, in the session repository."""


def build_spark_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.spark import write_spark_checkpoint

    model_dir = write_spark_checkpoint(data / "spark_tiny", preset="tiny", seed=0).resolve()
    install(
        "audio_tokenizer",
        repo,
        "audio_tokenizer",
        f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,max_reference_seconds:30",
    )
    install(
        "vocoder",
        repo,
        "vocoder",
        f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,cuda_graphs:auto,compile:auto,first_chunk_priority:false",
    )
    for name, decoupled, slots, interval in (
        ("tensorrt_llm", True, LLM_SLOTS, "auto"),
        ("tensorrt_llm_offline", False, 8, "auto"),
        ("tensorrt_llm_every3", True, 4, "3"),
    ):
        install(
            "tensorrt_llm_torch",
            repo,
            name,
            f"model_dir:{model_dir}/LLM,{COMMON},decoupled_mode:{decoupled},llm_max_batch_size:{slots},"
            "llm_max_seq_len:1024,llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false,"
            f"llm_decode_attention:auto,llm_decode_linear:auto,llm_decode_pdl:auto,llm_stream_interval:{interval},llm_output_tokens_from:{tokens.OUTPUT_WINDOW_FROM},"
            "first_chunk_priority:false,audio_tokens_per_s:50,first_chunk_tokens:18",
        )
    for name, decoupled, llm in (
        ("spark_tts", True, "tensorrt_llm"),
        ("spark_tts_offline", False, "tensorrt_llm_offline"),
    ):
        install_spark_bls(repo, name, model_dir, decoupled, {"tensorrt_llm": llm})
