"""Background processes that outlive the launcher: each in its own session, known by pid and start time.

The start time (clock ticks since boot, /proc/<pid>/stat field 22) guards against a recycled pid: a process
is ours only while both match, so `stop` never signals a stranger.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

POLL_S = 0.1


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name: [state, ppid, pgrp, ...] (field 3 onwards)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rsplit(")", 1)[1].split()


def start_ticks(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[19])


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    start_ticks: int

    def alive(self) -> bool:
        fields = _stat_fields(self.pid)
        return fields is not None and fields[0] != "Z" and int(fields[19]) == self.start_ticks

    def group_members(self) -> list[int]:
        """Live processes of the session this process leads (its pid is their process group)."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            fields = _stat_fields(int(entry.name))
            if fields is not None and fields[0] != "Z" and int(fields[2]) == self.pid:
                members.append(int(entry.name))
        return members

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> ProcessRef:
        return cls(int(data["pid"]), int(data["start_ticks"]))


@dataclass
class Spawned:
    process: subprocess.Popen
    ref: ProcessRef


def spawn(command: Sequence[str], env: Mapping[str, str], log_file: Path, pid_file: Path | None) -> Spawned:
    """Start `command` in a new session, stdout and stderr into `log_file`; writes `pid_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "wb") as log:
        process = subprocess.Popen(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
    ticks = start_ticks(process.pid)
    if pid_file is not None:
        pid_file.write_text(f"{process.pid}\n")
    return Spawned(process, ProcessRef(process.pid, ticks if ticks is not None else -1))


def stop(ref: ProcessRef, grace_s: float, whole_group: bool) -> bool:
    """SIGTERM the process (its whole group with `whole_group`), SIGKILL the group after `grace_s` or if
    members outlive it; False when it was not running. Waits until no member of the group is left."""
    if not ref.alive():
        _kill_group(ref)
        return False
    try:
        if whole_group:
            os.killpg(ref.pid, signal.SIGTERM)
        else:
            os.kill(ref.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while ref.alive() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    _kill_group(ref)
    return True


def _kill_group(ref: ProcessRef, timeout_s: float = 10.0) -> None:
    """SIGKILL what is left of the session `ref` led, and wait for it to go."""
    deadline = time.monotonic() + timeout_s
    while (ref.alive() or ref.group_members()) and time.monotonic() < deadline:
        try:
            os.killpg(ref.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        time.sleep(POLL_S)
