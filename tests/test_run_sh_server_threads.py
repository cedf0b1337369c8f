"""run.sh --server_cpu_threads, --server_malloc_arena_max, --server_cuda_alloc_conf and --compile_cache_dir: the
OMP_NUM_THREADS (auto: 1 on a GPU host), MALLOC_ARENA_MAX (2), PYTORCH_CUDA_ALLOC_CONF (expandable_segments:True)
and torch.compile cache folders that stages 3 and 7 give the servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG_LINE = "servers run with OMP_NUM_THREADS="
CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def path_with_nvidia_smi(tmp_path: Path, gpu: bool) -> str:
    """This PATH, behind a folder that holds a stand-in `nvidia-smi` when `gpu` (what run.sh takes for a GPU host)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if gpu:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\nexit 0\n")
        fake.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def stage_3(
    tmp_path: Path,
    options: list[str],
    gpu: bool,
    env_threads: str | None = None,
    env_arenas: str | None = None,
    env_cache: str | None = None,
    env_alloc_conf: str | None = None,
):
    """Stage 3 against a missing repository (the server never starts), with or without an `nvidia-smi` on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX", "PYTORCH_CUDA_ALLOC_CONF", *CACHE_VARS)
    }
    env["PATH"] = path_with_nvidia_smi(tmp_path, gpu)
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    if env_arenas is not None:
        env["MALLOC_ARENA_MAX"] = env_arenas
    if env_cache is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = env_cache
    if env_alloc_conf is not None:
        env["PYTORCH_CUDA_ALLOC_CONF"] = env_alloc_conf
    command = ["bash", "run.sh", "3", "3", "--exp_dir", str(tmp_path / "exp"), "--python", sys.executable]
    command += ["--model_repo", str(tmp_path / "no_repo"), "--python_stub", "wheel", *options]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "options, gpu, env_threads, expected",
    [
        ([], True, None, "1"),
        ([], False, None, None),  # CPU hosts: the LLM and token2wav need torch's threads
        (["--llm_device", "cpu"], True, None, None),
        ([], True, "3", None),  # the environment's own setting stands
        (["--server_cpu_threads", "4"], False, None, "4"),
        (["--server_cpu_threads", "0"], True, None, None),
    ],
)
def test_auto_gives_one_thread_on_gpu_hosts_only(tmp_path, options, gpu, env_threads, expected):
    done = stage_3(tmp_path, options, gpu, env_threads)
    lines = [line for line in done.stdout.splitlines() if LOG_LINE in line]
    if expected is None:
        assert not lines, done.stdout
    else:
        assert len(lines) == 1 and lines[0].endswith(f"{LOG_LINE}{expected} (--server_cpu_threads)")
    assert "model repository not found" in done.stdout + done.stderr  # it went on to start the server


def test_a_bad_value_exits_2_naming_the_option(tmp_path):
    done = stage_3(tmp_path, ["--server_cpu_threads", "many"], gpu=False)
    assert done.returncode == 2 and "--server_cpu_threads must be auto or a number" in done.stderr


ARENA_LINE = "servers run with MALLOC_ARENA_MAX="


@pytest.mark.parametrize(
    "options, env_arenas, expected",
    [
        ([], None, "2"),
        (["--server_malloc_arena_max", "4"], None, "4"),
        ([], "8", None),
        (["--server_malloc_arena_max", "0"], None, None),
    ],
)
def test_malloc_arenas_are_capped_unless_the_environment_sets_them(tmp_path, options, env_arenas, expected):
    done = stage_3(tmp_path, options, gpu=False, env_arenas=env_arenas)
    lines = [line for line in done.stdout.splitlines() if ARENA_LINE in line]
    if expected is None:
        assert not lines, done.stdout
    else:
        assert len(lines) == 1 and lines[0].endswith(f"{ARENA_LINE}{expected} (--server_malloc_arena_max)")


def test_a_bad_arena_count_exits_2_naming_the_option(tmp_path):
    done = stage_3(tmp_path, ["--server_malloc_arena_max", "few"], gpu=False)
    assert done.returncode == 2 and "--server_malloc_arena_max must be a number" in done.stderr


ALLOC_LINE = "servers run with PYTORCH_CUDA_ALLOC_CONF="


@pytest.mark.parametrize(
    "options, env_alloc_conf, expected",
    [
        ([], None, "expandable_segments:True"),
        (["--server_cuda_alloc_conf", ""], None, None),
        (["--server_cuda_alloc_conf", "max_split_size_mb:512"], None, "max_split_size_mb:512"),
        ([], "max_split_size_mb:512", None),
        (["--server_cuda_alloc_conf", "expandable_segments:True"], "max_split_size_mb:512", None),
    ],
)
def test_the_cuda_allocator_setting_is_given_unless_the_environment_has_one(
    tmp_path, options, env_alloc_conf, expected
):
    done = stage_3(tmp_path, options, gpu=True, env_alloc_conf=env_alloc_conf)
    lines = [line for line in done.stdout.splitlines() if ALLOC_LINE in line]
    if expected is None:
        assert not lines, done.stdout
    else:
        assert len(lines) == 1 and lines[0].endswith(f"{ALLOC_LINE}{expected} (--server_cuda_alloc_conf)")
    assert "model repository not found" in done.stdout + done.stderr


CACHE_LINE = "servers keep torch.compile's caches in "


@pytest.mark.parametrize(
    "options, env_cache, expected",
    [
        ([], None, "exp/compile_cache"),
        (["--compile_cache_dir", "{tmp}/mine"], None, "mine"),
        (["--compile_cache_dir", "none"], None, None),
        ([], "/somewhere/else", None),  # the environment's own folder stands
    ],
)
def test_the_compile_caches_live_under_exp_unless_told_otherwise(tmp_path, options, env_cache, expected):
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    done = stage_3(tmp_path, options, gpu=False, env_cache=env_cache)
    lines = [line for line in done.stdout.splitlines() if CACHE_LINE in line]
    if expected is None:
        assert not lines, done.stdout
        return
    folder = tmp_path / expected
    assert len(lines) == 1 and lines[0].endswith(f"{CACHE_LINE}{folder} (--compile_cache_dir)")
    assert folder.is_dir()
