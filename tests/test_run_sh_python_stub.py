"""On a GPU host, run.sh does not serve with the nvidia-pytriton wheel's python-backend stub (it corrupts its heap
under load there, docs/gpu-hosts.md): stage 3 stops before starting tritonserver and says how to build the fixed
stub, unless a stub is set or `--python_stub wheel` asks for the wheel's; CPU hosts serve with it as before. Stage
-1's `--build_python_stub auto` builds the fixed stub on a GPU host with nvcc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STARTED = "model repository not found"  # stage 3 went on to start the server (against a missing repository)
REFUSED = "would serve with the python-backend stub of the nvidia-pytriton wheel"


def host_path(tmp_path: Path, tools: tuple[str, ...]) -> str:
    """This PATH, behind a folder of stand-ins for `tools` (`nvidia-smi`: what run.sh takes for a GPU host)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        fake = bin_dir / tool
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def stage_3(tmp_path: Path, options: list[str], gpu: bool, stub_env: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TRITONTTS_PYTHON_STUB"}
    env["PATH"] = host_path(tmp_path, ("nvidia-smi",) if gpu else ())
    if stub_env is not None:
        env["TRITONTTS_PYTHON_STUB"] = stub_env
    command = ["bash", "run.sh", "3", "3", "--exp_dir", str(tmp_path / "exp"), "--python", sys.executable]
    command += ["--model_repo", str(tmp_path / "no_repo"), *options]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_a_gpu_host_is_refused_the_wheel_stub_with_the_fix(tmp_path):
    done = stage_3(tmp_path, [], gpu=True)
    assert done.returncode == 1
    assert REFUSED in done.stderr
    assert (
        "bash run.sh -1 -1 --build_python_stub true" in done.stderr and "--python_stub wheel" in done.stderr
    )
    assert STARTED not in done.stdout + done.stderr


@pytest.mark.parametrize(
    "options, gpu, stub_env",
    [
        ([], False, None),  # a CPU host: the wheel's stub, as before
        (["--python_stub", "wheel"], True, None),  # asked for
        ([], True, "/bin/true"),  # a stub set in the environment (a file; the server checks it)
        (["--llm_device", "cpu"], True, None),  # serving on the CPU of a GPU host
    ],
)
def test_otherwise_stage_3_goes_on_to_start_the_server(tmp_path, options, gpu, stub_env):
    done = stage_3(tmp_path, options, gpu, stub_env)
    assert REFUSED not in done.stderr
    assert STARTED in done.stdout + done.stderr


def test_a_stub_built_in_exp_dir_is_taken_on_a_gpu_host(tmp_path):
    built = tmp_path / "exp" / "python_stub" / "triton_python_backend_stub"
    built.parent.mkdir(parents=True)
    built.write_bytes(Path("/bin/true").read_bytes())
    done = stage_3(tmp_path, [], gpu=True)
    assert REFUSED not in done.stderr and STARTED in done.stdout + done.stderr


@pytest.mark.skipif(
    sys.prefix == sys.base_prefix, reason="stage -1 installs into a venv: run the tests in one"
)
@pytest.mark.parametrize("gpu", [True, False])
def test_stage_minus_1_builds_the_fixed_stub_on_a_gpu_host_only(tmp_path, gpu):
    """Stage -1 on this test's own venv (its requirements are installed already): on a GPU host with nvcc (this
    machine has CUDA's) `auto` starts the build; whether it succeeds depends on the host's compiler and boost, and
    a failed automatic build leaves stage -1 to finish, saying what serving will do."""
    if not (
        subprocess.run(["bash", "-c", "command -v nvcc || [ -x /usr/local/cuda/bin/nvcc ]"]).returncode == 0
    ):
        pytest.skip("no nvcc on this host")
    env = {k: v for k, v in os.environ.items() if k != "TRITONTTS_PYTHON_STUB"}
    env["PATH"] = host_path(tmp_path, ("nvidia-smi",) if gpu else ())
    command = ["bash", "run.sh", "-1", "-1", "--venv_dir", sys.prefix, "--exp_dir", str(tmp_path / "exp")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    building = "building python_backend r24.12's stub (--build_python_stub auto" in done.stdout
    assert building is gpu
    built = (tmp_path / "exp" / "python_stub" / "triton_python_backend_stub").is_file()
    assert built or not gpu or "the stub build failed" in done.stdout
