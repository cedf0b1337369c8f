"""Stubs that outlive a test server: one blocked for ever sending to a caller a test killed (tritonserver 2.51)
cannot exit with its server. Production runs tritontts.triton.watchdog beside the server, whose last sweep kills
them; a test server has none, so its fixture ends them by their model repository's path."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tritontts.triton.stubs import stubs_serving


def kill_leftover_stubs(repo: Path) -> list[int]:
    """SIGKILL every stub still serving `repo` (call once its server has exited); the pids killed."""
    killed = []
    for stub in stubs_serving(repo):
        try:
            os.kill(stub.pid, signal.SIGKILL)
            killed.append(stub.pid)
        except ProcessLookupError:
            pass
    return killed
