"""The benchmark suite's processes: one runner at a time per exp dir (`run`), a runner started in the background
(`detach`), and every part's state (`status`); what each part runs is tritontts/bench/suite.py."""

from __future__ import annotations

import datetime
import os
import shlex
import signal
import subprocess
import sys
import time

from tritontts.bench.suite import Runner
from tritontts.bench.suite_config import SuiteConfig
from tritontts.bench.suite_state import SuiteState, render_status


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def run(config: SuiteConfig, argv: list[str]) -> int:
    """One runner at a time per exp dir; SIGTERM ends the part in progress (its server stopped) and the run."""
    runner = Runner(config)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        with runner.state.runner(list(config.parts), argv):
            return runner.run()
    except BlockingIOError:
        info = runner.state.runner_info() or {}
        print(
            f"error: a suite runner (pid {info.get('pid', '?')}) is already running on {runner.state.root}",
            file=sys.stderr,
        )
        return 2


def detach(config: SuiteConfig, argv: list[str], wait_s: float = 20.0) -> int:
    """Starts `argv` (this runner without --detach) in a new session from this working directory, its output
    into suite.log; returns once it holds the runner lock, or with its exit status when it ended first."""
    state = SuiteState(config.exp_dir)
    state.root.mkdir(parents=True, exist_ok=True)
    if state.runner_info() is not None:
        print(f"error: a suite runner is already running on {state.root}", file=sys.stderr)
        return 2
    with open(state.log, "a", encoding="utf-8") as log:
        log.write(f"\n=== {datetime.datetime.now():%F %T} detached: {shlex.join(argv)}\n")
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        process = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        info = state.runner_info()
        if info is not None and info.get("pid") == process.pid:
            print(
                f"suite running in the background (pid {process.pid}); log {state.log}; status {state.status_file}"
            )
            return 0
        if process.poll() is not None:
            print(
                f"the suite ran in the background and ended already (exit {process.returncode}); log {state.log}"
            )
            return process.returncode
        time.sleep(0.2)
    print(f"suite started in the background (pid {process.pid}); log {state.log}")
    return 0


def status(config: SuiteConfig, wait_s: float = 0.0, tail_lines: int = 30) -> int:
    """Prints every selected part's state, after waiting up to `wait_s` for a running suite to end.
    0: all done; 1: one failed; 3: some not done yet (pending, running, interrupted, stale)."""
    runner = Runner(config)
    end = time.monotonic() + wait_s
    while time.monotonic() < end and runner.state.runner_info() is not None:
        time.sleep(min(5.0, max(0.1, end - time.monotonic())))
    statuses = runner.statuses()
    print(render_status(runner.state, statuses, tail_lines), end="")
    if any(s.state == "failed" for s in statuses):
        return 1
    return 0 if all(s.state == "done" for s in statuses) else 3
