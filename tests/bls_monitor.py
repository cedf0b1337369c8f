"""A BLS model's callee monitor (tritontts.triton.stubs.CalleeMonitor) runs from load, not from the first request
an instance serves: checked on a copy of a BLS model that no test sends a request to."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from waiting import wait_until

from tritontts.triton.stubs import current_stubs


def unused_copy(source: str, name: str) -> Callable[[Path, Path], None]:
    """A TRITON_MODELS entry copying the session repository's `source` model to `name` (listed after the builder
    that makes `source`)."""

    def build(repo: Path, data: Path) -> None:
        shutil.copytree(repo / source, repo / name)
        config = repo / name / "config.pbtxt"
        config.write_text(re.sub(r'^name: ".*"$', f'name: "{name}"', config.read_text(), count=1, flags=re.M))

    build.__name__ = f"copy_{name}"
    return build


def assert_monitor_runs_from_load(triton, model: str, instances: int) -> None:
    """Load `model` (never requested) and find the monitor's thread, named for the OS, in each instance's stub."""
    triton.load(model)
    stubs = [s for s in current_stubs(triton.server.pid).values() if s.model == model]
    assert len(stubs) == instances
    for stub in stubs:
        tasks = Path(f"/proc/{stub.pid}/task")
        # the thread names itself (PR_SET_NAME) when it starts running, which may come a moment after the load
        wait_until(
            lambda tasks=tasks: {p.read_text().strip() for p in tasks.glob("*/comm")},
            lambda threads: "callee-monitor" in threads,
            f"a thread named callee-monitor in {model}'s stub {stub.pid}",
            timeout=10,
        )
