"""Bounded waits of the tests, for a machine that may be slow or busy (CI runs the suite on 2 shared cores).

- `wait_until(read, done, what)` polls a reading (a Triton statistic, a metric, a log) until it is what the test
  waits for, and fails naming what it last read: Triton counts a request, and a model records its metrics, a
  moment after the response has left, so a test reads them only through this.
- `wait_started(process, probe, what, log)` waits for a process we started to be ready: it stops at once when the
  process exits, keeps waiting past its bound while the process is still making progress (CPU time, log output),
  and when it gives up says why: the exit code, the probe's last answer, the Python stacks of the process (it
  runs with PYTHONFAULTHANDLER, see `python_env`), and the end of its log.

Every bound is multiplied by TRITONTTS_TEST_TIMEOUT_SCALE (default 1): set it to 2 or 3 on a slow machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
SCALE_VARIABLE = "TRITONTTS_TEST_TIMEOUT_SCALE"


def timeout_scale() -> float:
    value = os.environ.get(SCALE_VARIABLE, "1")
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"{SCALE_VARIABLE} must be a number, got {value!r}") from None
    if scale <= 0:
        raise ValueError(f"{SCALE_VARIABLE} must be positive, got {value!r}")
    return scale


def scaled(seconds: float) -> float:
    """`seconds` times TRITONTTS_TEST_TIMEOUT_SCALE."""
    return seconds * timeout_scale()


def wait_until(
    read: Callable[[], T],
    done: Callable[[T], bool],
    what: str,
    timeout: float = 30.0,
    interval: float = 0.05,
) -> T:
    """The first reading `read()` for which `done(reading)` holds; after `timeout` seconds (scaled) an
    AssertionError saying `what` was waited for and what was last read."""
    limit = scaled(timeout)
    started = time.monotonic()
    while True:
        reading = read()
        if done(reading):
            return reading
        if time.monotonic() - started > limit:
            text = repr(reading)
            text = text if len(text) <= 4000 else "..." + text[-4000:]
            raise AssertionError(f"waited {limit:.0f} s for {what}; last read: {text}")
        time.sleep(interval)


def python_env(**extra: str) -> dict[str, str]:
    """The environment of a Python process a test starts: unbuffered output (its log is complete whenever it
    is read), and tracebacks of every thread on a fatal signal (`wait_started` sends SIGABRT when it gives up)."""
    return os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"} | extra


def log_tail(log: Path | None, chars: int = 4000) -> str:
    if log is None:
        return ""
    try:
        text = Path(log).read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        return f"\n--- {log}: unreadable ({err}) ---"
    if not text.strip():
        return f"\n--- {log} is empty ---"
    return f"\n--- end of {log} ---\n{text[-chars:]}"


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process `pid` (Linux), None when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _size(path: Path | None) -> int:
    try:
        return Path(path).stat().st_size if path is not None else 0
    except OSError:
        return 0


def wait_started(
    process: subprocess.Popen,
    probe: Callable[[], tuple[bool, str]],
    what: str,
    log: Path | None,
    timeout: float = 120.0,
    stall: float = 60.0,
    interval: float = 0.3,
) -> float:
    """Poll `probe()` -> (ready, what it answered) until ready; returns the seconds it took.

    Raises AssertionError at once when `process` exits (with its exit code and log). Past `timeout` seconds
    (scaled) it keeps waiting while the process made progress in the last `stall` seconds (scaled): it used
    CPU, its log grew, or the probe's answer changed; it never waits past 3 x `timeout`. When it gives up, the
    process is stopped with SIGABRT first (faulthandler prints its stacks into the log), then killed."""
    limit, stall_limit = scaled(timeout), scaled(stall)
    started = time.monotonic()
    last_progress, seen = started, None
    answer = "not probed yet"
    while True:
        code = process.poll()
        if code is not None:
            raise AssertionError(
                f"{what}: the process (pid {process.pid}) exited with code {code} after "
                f"{time.monotonic() - started:.1f} s; last probe: {answer}{log_tail(log)}"
            )
        ready, answer = probe()
        if ready:
            return time.monotonic() - started
        now = time.monotonic()
        state = (cpu_seconds(process.pid), _size(log), answer)
        if state != seen:
            last_progress, seen = now, state
        waited = now - started
        if waited > limit and (now - last_progress > stall_limit or waited > 3 * limit):
            cpu = state[0]
            raise AssertionError(
                f"{what}: not ready after {waited:.0f} s (bound {limit:.0f} s, {SCALE_VARIABLE}="
                f"{timeout_scale():g}); the process (pid {process.pid}) was still running, "
                f"{'?' if cpu is None else f'{cpu:.1f}'} s of CPU used, last progress {now - last_progress:.0f} s "
                f"ago; last probe: {answer}; its exit code after SIGABRT: {_abort(process)}{log_tail(log)}"
            )
        time.sleep(interval)


def _abort(process: subprocess.Popen) -> int | None:
    """SIGABRT (a faulthandler dumps every thread's stack), then SIGKILL if needed; the exit code."""
    try:
        process.send_signal(signal.SIGABRT)
        return process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
