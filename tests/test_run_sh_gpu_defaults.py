"""run.sh's serving defaults follow the host: `--llm_compile auto` and `--bls_instance_num auto` are true and 16
where nvidia-smi exists and the LLM is not on the CPU (the layout every GPU measurement used), false and 4 elsewhere;
CosyVoice2's token2wav answers first chunks from a queue and keeps 4 GiB of voice prefixes there, unless it runs on
the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_run_sh_server_threads import path_with_nvidia_smi

ROOT = Path(__file__).resolve().parents[1]


def stage_2(tmp_path: Path, options: list[str], gpu: bool) -> subprocess.CompletedProcess:
    """Stage 2 against a missing checkpoint (it logs its settings, then stops), with or without nvidia-smi."""
    env = dict(os.environ, PATH=path_with_nvidia_smi(tmp_path, gpu))
    command = ["bash", "run.sh", "2", "2", "--exp_dir", str(tmp_path / "exp"), "--python", sys.executable]
    command += ["--model_source", str(tmp_path / "no_checkpoint"), *options]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "options, gpu, expected",
    [
        ([], True, "serving defaults for a GPU host: --llm_compile true --bls_instance_num 16 (auto)"),
        ([], False, "serving defaults for this CPU host: --llm_compile false --bls_instance_num 4 (auto)"),
        (["--llm_device", "cpu"], True, "this CPU host: --llm_compile false --bls_instance_num 4 (auto)"),
        (["--bls_instance_num", "64"], True, "serving defaults for a GPU host: --llm_compile true (auto)"),
        (["--llm_compile", "false", "--bls_instance_num", "8"], True, None),
        (
            ["--model", "cosyvoice2"],
            True,
            "a GPU host: --llm_compile true --bls_instance_num 16 --token2wav_first_chunks_first queue"
            " --token2wav_voice_prefix_gib 4 (auto)",
        ),
        (
            [
                "--model",
                "cosyvoice2",
                "--model_device",
                "cpu",
                "--llm_compile",
                "true",
                "--bls_instance_num",
                "8",
            ],
            True,
            "a GPU host: --token2wav_first_chunks_first true --token2wav_voice_prefix_gib 0 (auto)",
        ),
        (
            ["--model", "cosyvoice2"],
            False,
            "this CPU host: --llm_compile false --bls_instance_num 4 --token2wav_first_chunks_first true"
            " --token2wav_voice_prefix_gib 0 (auto)",
        ),
        (
            ["--model", "cosyvoice2", "--token2wav_first_chunks_first", "true"],
            True,
            "--token2wav_voice_prefix_gib 4 (auto)",
        ),
    ],
)
def test_auto_serving_defaults_follow_the_host(tmp_path, options, gpu, expected):
    done = stage_2(tmp_path, options, gpu)
    lines = [line for line in done.stdout.splitlines() if "serving defaults" in line]
    if expected is None:
        assert not lines, done.stdout
    else:
        assert len(lines) == 1 and lines[0].endswith(expected), done.stdout
    assert done.returncode != 0  # it went on and found no checkpoint


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--llm_compile", "yes", "--llm_compile must be auto, true or false"),
        ("--bls_instance_num", "0", "--bls_instance_num must be auto or a positive integer"),
    ],
)
def test_a_bad_value_exits_2_naming_the_option(tmp_path, option, value, message):
    done = stage_2(tmp_path, [option, value], gpu=False)
    assert done.returncode == 2 and message in done.stderr
