"""Signalling a python-backend stub of the test session's tritonserver and reading what it printed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from waiting import wait_until


def signal_stub(server, model: str, signum: int, expect: str, timeout: float = 30.0) -> str:
    """Send `signum` to one stub of `model` (the stubs run in the server's session); return what the server log
    gained once it shows `expect` (an AssertionError with what it gained after `timeout` seconds, scaled)."""
    pattern = f"triton_python_backend_stub.*{model}"
    session = str(server.process.pid)
    stubs = subprocess.run(
        ["pgrep", "-s", session, "-f", pattern], capture_output=True, text=True
    ).stdout.split()
    assert stubs, f"no python-backend stub of {model} found"
    log = Path(server.config.log_file)
    size = log.stat().st_size
    os.kill(int(stubs[0]), signum)
    return wait_until(
        lambda: log.read_bytes()[size:].decode(errors="replace"),
        lambda added: expect in added,
        f"{expect!r} in the server log after signal {signum} to the stub of {model}",
        timeout=timeout,
        interval=0.1,
    )
