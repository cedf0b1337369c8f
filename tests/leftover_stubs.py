"""Stubs that outlive a test server: one blocked for ever sending to a caller a test killed (tritonserver 2.51)
cannot exit with its server. Production runs tritontts.triton.watchdog beside the server, whose last sweep kills
them; a test server has none, so its fixture ends them by their model repository's path."""

from __future__ import annotations

import os
import signal
from pathlib import Path

STUB_NAME = b"triton_python_backend_stub"


def stubs_serving(repo: Path) -> list[int]:
    """Pids of live python-backend stubs whose command line names a model under `repo`."""
    marker = str(repo.resolve()).encode() + b"/"
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(STUB_NAME) and any(arg.startswith(marker) for arg in argv[1:]):
            pids.append(int(entry.name))
    return pids


def kill_leftover_stubs(repo: Path) -> list[int]:
    """SIGKILL every stub still serving `repo` (call once its server has exited); the pids killed."""
    killed = []
    for pid in stubs_serving(repo):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed
