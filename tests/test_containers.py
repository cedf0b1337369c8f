"""Dockerfile.server and docker-compose.yml: pinned base, what the image installs, what the service runs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE = "nvcr.io/nvidia/tritonserver:25.06-trtllm-python-py3"
COMPOSE_RUN_SH_OPTIONS = ("model", "llm_backend", "model_source", "server_address", "foreground")


def dockerfile() -> str:
    return (REPO / "Dockerfile.server").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", dockerfile())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_base_image_is_the_pinned_trtllm_release():
    froms = [args for op, args in instructions() if op == "FROM"]
    assert froms == [BASE_IMAGE]
    assert "TensorRT-LLM 0.20.0" in dockerfile()


def test_image_installs_requirements_without_replacing_torch_or_numpy():
    runs = " ".join(args for op, args in instructions() if op == "RUN")
    assert "pip install --no-cache-dir -r requirements.txt -c /tmp/container-constraints.txt" in runs
    assert "numpy==" in runs and "torch==" in runs
    assert "pip install --no-cache-dir --no-deps ." in runs
    assert "numpy<2" in (REPO / "requirements.txt").read_text()


def test_image_copies_what_run_sh_needs_and_exposes_the_ports():
    ops = instructions()
    copied = " ".join(args for op, args in ops if op == "COPY").split()
    for needed in ("run.sh", "model_repo/", "scripts/", "client_grpc.py", "client_http.py", "tritontts/"):
        assert needed in copied, needed
    sources = [s for op, args in ops if op == "COPY" for s in args.split()[:-1]]
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, f"COPY sources missing from the repository: {missing}"
    assert ("WORKDIR", "/workspace") in ops
    assert ("EXPOSE", "8000 8001 8002") in ops


def test_compose_service_structure():
    tts = compose()["services"]["tts"]
    assert tts["build"]["dockerfile"] == "Dockerfile.server" and (REPO / tts["build"]["dockerfile"]).exists()
    assert tts["image"].startswith("${TTS_IMAGE:-")
    assert tts["shm_size"] and tts["restart"] == "unless-stopped"
    assert set(tts["ports"]) == {"8000:8000", "8001:8001", "8002:8002"}
    (device,) = tts["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["count"] == 1 and device["capabilities"] == ["gpu"]
    env = tts["environment"]
    assert env["MODEL"] == "${MODEL:-spark_tts}" and env["MODE"] == "${MODE:-streaming}"
    assert (
        env["LLM_BACKEND"] == "${LLM_BACKEND:-trtllm}"
        and env["MODEL_SOURCE"] == "${MODEL_SOURCE:-huggingface}"
    )
    volume, target = tts["volumes"][0].split(":")[:2]
    assert target == "/workspace/exp" and volume in compose()["volumes"]
    assert tts["healthcheck"]["test"][-1] == "http://localhost:8000/v2/health/ready"
    assert "curl" in tts["healthcheck"]["test"]


def test_compose_command_runs_run_sh_in_the_foreground_with_known_options():
    command = " ".join(compose()["services"]["tts"]["command"])
    assert 'bash run.sh 0 3 "$$MODE"' in command and "--foreground true" in command
    run_sh = (REPO / "run.sh").read_text()
    for option in COMPOSE_RUN_SH_OPTIONS:
        assert f"--{option} " in command, option
        assert re.search(rf"^{option}=", run_sh, re.M), f"run.sh has no --{option} option"


def compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_validates():
    cli = compose_cli()
    if cli is None:
        pytest.skip("neither `docker compose` (docker-compose-plugin) nor docker-compose is installed")
    result = subprocess.run(
        [*cli, "-f", str(REPO / "docker-compose.yml"), "config"], capture_output=True, text=True, cwd=REPO
    )
    assert result.returncode == 0, result.stderr
    assert "/workspace/exp" in result.stdout
