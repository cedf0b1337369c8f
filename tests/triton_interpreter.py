"""What the Triton-kernel tests share: a tiny engine model, and running a test file's kernel tests in a process
under Triton's CPU interpreter (TRITON_INTERPRET=1 must be set before triton is first imported)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from types import ModuleType

import pytest
import torch

from tritontts.llm.config import Qwen2Config
from tritontts.llm.loader import build_model
from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict

VOCAB = 1000
IN_INTERPRETER = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def tiny_model():
    config = Qwen2Config.from_dict(qwen2_config("tiny", vocab_size=VOCAB))
    return build_model(
        config, qwen2_state_dict("tiny", seed=3, vocab_size=VOCAB), "cpu", torch.float32, "synthetic"
    )


def interpreted(module: str) -> ModuleType:
    """`module` (it imports triton) inside the interpreter's process; elsewhere the test is skipped."""
    if not IN_INTERPRETER:
        pytest.skip("runs in the TRITON_INTERPRET=1 process of test_kernels_under_the_triton_interpreter")
    pytest.importorskip("triton")
    return importlib.import_module(module)


def run_under_interpreter(test_file: str) -> None:
    """Run `test_file` with TRITON_INTERPRET=1 in a new process; fails with its output unless all passed."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", test_file]
    env = os.environ | {"TRITON_INTERPRET": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout, done.stdout[-2000:]
