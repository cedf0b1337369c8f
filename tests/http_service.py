"""Starting a Python HTTP service (`python -m ...`) on a free loopback port for a test, and stopping it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
from waiting import python_env, scaled, wait_started

from tritontts.triton.server import free_ports


def health_probe(url: str, wait_for: int = 200) -> Callable[[], tuple[bool, str]]:
    """A `waiting.wait_started` probe: whether GET `url`/health answers `wait_for`, and what it answered."""

    def probe() -> tuple[bool, str]:
        try:
            reply = httpx.get(f"{url}/health", timeout=scaled(10))
        except httpx.TransportError as err:
            return False, f"{type(err).__name__}: {err}"
        return reply.status_code == wait_for, f"{reply.status_code} {reply.text[:500]}"

    return probe


def start_python(command: Sequence[str], log_file: Path, mode: str = "wb") -> subprocess.Popen:
    """`command` (a Python one) with its stdout and stderr, unbuffered, in `log_file` (nothing else is written
    there: tests read it, tests/test_reliability_security.py for the API key that must never be in it)."""
    with open(log_file, mode) as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=python_env())


@contextmanager
def http_service(
    module: str, args: Sequence[str], log_file: Path, wait_for: int = 200, timeout_s: float = 180.0
) -> Iterator[str]:
    """`python -m module --port P *args`; yields its base URL once `/health` answers `wait_for`.

    The wait (see waiting.wait_started) ends at once if the process exits; it lasts `timeout_s` seconds times
    TRITONTTS_TEST_TIMEOUT_SCALE, longer while the process still makes progress."""
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    process = start_python([sys.executable, "-m", module, "--port", str(port), *args], log_file)
    try:
        wait_started(
            process,
            health_probe(url, wait_for),
            f"{module} answering {wait_for} on {url}/health",
            log_file,
            timeout_s,
        )
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
