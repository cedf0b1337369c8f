"""Every family's CPU quick start, `bash run.sh -1 5 offline --model M --model_source synthetic-tiny --llm_backend
torch`, in a virtual environment that stage -1 makes from requirements.txt alone, as a new user gets it.

The test environment (requirements-dev.txt) is not used: the venv is new, run.sh's own stage -1 fills it, and
every stage after it runs with that venv's python. One venv serves all four families. The benchmark of stage 4
reads a 4-row dataset instead of the 26-row default, so the four quick starts fit in CI's time.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import soundfile

from tritontts.triton.server import free_ports

pytestmark = [pytest.mark.triton, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("spark_tts", "cosyvoice2", "cosyvoice2_dit", "cosyvoice3")
STAGE_TIMEOUT_S = 1800


def _user_environment() -> dict[str, str]:
    """This environment without the test venv: no VIRTUAL_ENV, no venv on PATH, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "/.venv/" not in p)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_RETRIES"] = "0"  # an index this machine cannot reach (PyTorch's) fails at once: 150 -> 57 s here
    return env


def _run_sh(*args: str, log: Path) -> subprocess.CompletedProcess:
    with log.open("w") as out:
        return subprocess.run(
            ["bash", "run.sh", *args],
            cwd=ROOT,
            env=_user_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=STAGE_TIMEOUT_S,
        )


def _tail(log: Path, lines: int = 60) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory) -> Path:
    """A venv made by stage -1 from requirements.txt (and the pytriton wheel, and this package)."""
    home = tmp_path_factory.mktemp("quickstart")
    venv = home / "venv"
    log = home / "stage-1.log"
    done = _run_sh("-1", "-1", "--venv_dir", str(venv), "--exp_dir", str(home / "exp"), log=log)
    assert done.returncode == 0, _tail(log)
    return venv


def test_the_venv_is_the_users_not_the_tests(user_venv):
    listed = subprocess.run(
        [str(user_venv / "bin/python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert {"torch", "onnx", "onnxruntime", "nvidia-pytriton", "tritonclient", "tritontts"} <= names
    assert not names & {"pytest", "ruff", "transformers", "librosa"}, (
        "requirements-dev.txt leaked into stage -1"
    )


@pytest.mark.parametrize("model", FAMILIES)
def test_cpu_quick_start_of_each_family(user_venv, bench_data, tmp_path, model):
    http, grpc, metrics = free_ports(3)
    common = ["--model", model, "--venv_dir", str(user_venv), "--exp_dir", str(tmp_path / "exp")]
    ports = ["--http_port", str(http), "--grpc_port", str(grpc), "--metrics_port", str(metrics)]
    log = tmp_path / "quickstart.log"
    try:
        done = _run_sh(
            "-1",
            "5",
            "offline",
            "--model_source",
            "synthetic-tiny",
            "--llm_backend",
            "torch",
            "--dataset",
            str(bench_data),
            *common,
            *ports,
            log=log,
        )
        assert done.returncode == 0, _tail(log)
    finally:
        _run_sh("stop", *common, *ports, log=tmp_path / "stop.log")
    home = tmp_path / "exp" / model
    (run,) = json.loads((home / "log_offline_tasks_2" / "summary.json").read_text())["runs"]
    assert (run["succeeded"], run["failed"]) == (4, 0), run
    wav = home / "single_offline" / "output.wav"
    assert soundfile.info(wav).frames > 0
