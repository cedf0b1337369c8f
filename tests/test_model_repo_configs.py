"""run.sh stage 2 renders every model's config.pbtxt, in both modes, for both LLM backends."""

import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

ROOT = Path(__file__).resolve().parents[1]


def render(tmp_path: Path, mode: str, backend: str) -> Path:
    model_dir = tmp_path / "checkpoint"
    model_dir.mkdir(exist_ok=True)
    subprocess.run(
        [
            "bash",
            "run.sh",
            "2",
            "2",
            mode,
            "--llm_backend",
            backend,
            "--model_source",
            str(model_dir),
            "--exp_dir",
            str(tmp_path / "exp"),
            "--python",
            sys.executable,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return tmp_path / "exp" / "spark_tts" / f"model_repo_{backend}_{mode}"


@pytest.mark.parametrize("backend", ["torch", "trtllm"])
@pytest.mark.parametrize("mode", ["streaming", "offline"])
def test_rendered_configs_parse_as_model_config(tmp_path, mode, backend):
    repo = render(tmp_path, mode, backend)
    configs = {p.parent.name: p.read_text() for p in repo.glob("*/config.pbtxt")}
    assert set(configs) == {"spark_tts", "audio_tokenizer", "vocoder", "tensorrt_llm"}
    parsed = {}
    for name, text in configs.items():
        assert "${" not in text, f"{name} has an unfilled placeholder"
        parsed[name] = text_format.Parse(text, model_config_pb2.ModelConfig())
        assert parsed[name].name == name
    for name in ("spark_tts", "tensorrt_llm"):
        assert parsed[name].model_transaction_policy.decoupled is (mode == "streaming")
    expected_backend = "tensorrtllm" if backend == "trtllm" else "python"
    assert parsed["tensorrt_llm"].backend == expected_backend
    assert (repo / "tensorrt_llm" / "1").is_dir()
    if backend == "torch":
        assert (repo / "tensorrt_llm" / "1" / "model.py").is_file()
