"""Signalling a python-backend stub of the test session's tritonserver and reading what it printed."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def signal_stub(server, model: str, signum: int, expect: str) -> str:
    """Send `signum` to one stub of `model` (the stubs run in the server's session); return what the server log
    gained until it shows `expect`, or after 5 s."""
    pattern = f"triton_python_backend_stub.*{model}"
    session = str(server.process.pid)
    stubs = subprocess.run(
        ["pgrep", "-s", session, "-f", pattern], capture_output=True, text=True
    ).stdout.split()
    assert stubs, f"no python-backend stub of {model} found"
    log = Path(server.config.log_file)
    size = log.stat().st_size
    os.kill(int(stubs[0]), signum)
    for _ in range(50):
        added = log.read_bytes()[size:].decode(errors="replace")
        if expect in added:
            break
        time.sleep(0.1)
    return added
