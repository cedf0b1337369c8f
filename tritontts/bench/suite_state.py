"""Where the benchmark suite keeps its state, under `<exp_dir>/suite/`:

suite.log               the runner's own log (a detached runner writes everything here)
runner.lock, runner.json  held and written by the one runner at a time (its pid, its parts)
status.txt              what `status` prints, rewritten at every part's start and end
parts/<part>/log        every command of the part and its output
parts/<part>/running    the part has started (pid of its runner, when)
parts/<part>/done       it finished: its settings, seconds, the schema JSON it wrote
parts/<part>/failed     it failed: exit status, why, seconds
parts/<part>/result.json  the schema JSON (meta, headline, the raw output)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritontts.processes import pid_alive


def part_slug(name: str) -> str:
    return name.replace(":", "_")

    return True


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


@dataclass(frozen=True)
class PartStatus:
    name: str
    state: str  # pending | running | interrupted | done | stale | failed
    seconds: float | None = None
    detail: str = ""
    log: Path | None = None


class SuiteState:
    def __init__(self, exp_dir: Path) -> None:
        self.root = Path(exp_dir) / "suite"

    @property
    def log(self) -> Path:
        return self.root / "suite.log"

    @property
    def status_file(self) -> Path:
        return self.root / "status.txt"

    def part_dir(self, name: str) -> Path:
        return self.root / "parts" / part_slug(name)

    def part_log(self, name: str) -> Path:
        return self.part_dir(name) / "log"

    def start(self, name: str) -> Path:
        folder = self.part_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        for marker in ("done", "failed"):
            (folder / marker).unlink(missing_ok=True)
        _write_json(folder / "running", {"pid": os.getpid(), "started": time.time()})
        self.part_log(name).write_text("", encoding="utf-8")
        return folder

    def finish(self, name: str, ok: bool, info: dict[str, Any]) -> None:
        folder = self.part_dir(name)
        _write_json(folder / ("done" if ok else "failed"), info | {"finished": time.time()})
        (folder / "running").unlink(missing_ok=True)

    def done_info(self, name: str) -> dict | None:
        return _read_json(self.part_dir(name) / "done")

    def is_done(self, name: str, settings: dict) -> bool:
        info = self.done_info(name)
        return info is not None and info.get("settings") == settings

    def status(self, name: str, settings: dict) -> PartStatus:
        folder, log = self.part_dir(name), self.part_log(name)
        running = _read_json(folder / "running")
        if running is not None:
            seconds = time.time() - running.get("started", time.time())
            if pid_alive(int(running.get("pid", 0))):
                return PartStatus(name, "running", seconds, f"runner pid {running['pid']}", log)
            return PartStatus(name, "interrupted", None, "its runner is gone; the next run redoes it", log)
        done = _read_json(folder / "done")
        if done is not None:
            state = "done" if done.get("settings") == settings else "stale"
            detail = done.get("result", "")
            if state == "stale":
                detail = f"done with other settings ({detail}); the next run redoes it"
            return PartStatus(name, state, done.get("seconds"), detail, log)
        failed = _read_json(folder / "failed")
        if failed is not None:
            return PartStatus(name, "failed", failed.get("seconds"), failed.get("reason", ""), log)
        return PartStatus(name, "pending")

    @contextlib.contextmanager
    def runner(self, parts: list[str], argv: list[str]) -> Iterator[None]:
        """Holds the runner lock for the block (BlockingIOError when another runner holds it)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "runner.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_json(
                self.root / "runner.json",
                {"pid": os.getpid(), "started": time.time(), "parts": parts, "argv": argv},
            )
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def runner_info(self) -> dict | None:
        """runner.json when a runner holds the lock now, else None."""
        path = self.root / "runner.lock"
        if not path.exists():
            return None
        with open(path, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read_json(self.root / "runner.json") or {}
            fcntl.flock(lock, fcntl.LOCK_UN)
        return None


def tail(path: Path | None, lines: int) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def render_status(state: SuiteState, statuses: list[PartStatus], tail_lines: int) -> str:
    runner = state.runner_info()
    if runner is None:
        head = "runner: not running"
    else:
        head = f"runner: running (pid {runner.get('pid', '?')})"
    lines = [f"suite state: {state.root}", head, f"log: {state.log}", ""]
    width = max([len(s.name) for s in statuses] + [4])
    lines.append(f"{'part'.ljust(width)}  {'state':<11}  {'seconds':>7}  detail")
    for s in statuses:
        seconds = "" if s.seconds is None else f"{s.seconds:.0f}"
        lines.append(f"{s.name.ljust(width)}  {s.state:<11}  {seconds:>7}  {s.detail}")
    for s in statuses:
        if s.state == "failed":
            lines += ["", f"--- {s.name} failed: {s.detail}; last lines of {s.log}:", tail(s.log, tail_lines)]
    counts = {name: sum(s.state == name for s in statuses) for name in ("done", "failed")}
    lines += ["", f"{counts['done']} of {len(statuses)} parts done, {counts['failed']} failed"]
    return "\n".join(lines) + "\n"
