"""Signalling python-backend stubs of a test tritonserver and reading what they printed to its log."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from waiting import wait_until


def signal_and_read_log(
    server, pids: Iterable[int], signum: int, done: Callable[[str], bool], what: str, timeout: float = 30.0
) -> str:
    """Send `signum` to the processes `pids` (one already gone is skipped); return what the server log gained once
    `done(gained)` holds (an AssertionError saying `what` and what it gained after `timeout` seconds, scaled)."""
    log = Path(server.config.log_file)
    size = log.stat().st_size
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return wait_until(
        lambda: log.read_bytes()[size:].decode(errors="replace"), done, what, timeout=timeout, interval=0.1
    )


def signal_stub(server, model: str, signum: int, expect: str, timeout: float = 30.0) -> str:
    """Send `signum` to one stub of `model` (the stubs run in the server's session); return what the server log
    gained once it shows `expect` (an AssertionError with what it gained after `timeout` seconds, scaled)."""
    pattern = f"triton_python_backend_stub.*{model}"
    session = str(server.process.pid)
    stubs = subprocess.run(
        ["pgrep", "-s", session, "-f", pattern], capture_output=True, text=True
    ).stdout.split()
    assert stubs, f"no python-backend stub of {model} found"
    return signal_and_read_log(
        server,
        [int(stubs[0])],
        signum,
        lambda added: expect in added,
        f"{expect!r} in the server log after signal {signum} to the stub of {model}",
        timeout,
    )
