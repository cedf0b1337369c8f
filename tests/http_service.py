"""Starting a Python HTTP service (`python -m ...`) on a free loopback port for a test, and stopping it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

from tritontts.triton.server import free_ports


@contextmanager
def http_service(
    module: str, args: Sequence[str], log_file: Path, wait_for: int = 200, timeout_s: float = 120.0
) -> Iterator[str]:
    """`python -m module --port P *args`; yields its base URL once `/health` answers `wait_for`."""
    (port,) = free_ports(1)
    command = [sys.executable, "-m", module, "--port", str(port), *args]
    with open(log_file, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{module} exited with {process.returncode}:\n{log_file.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=10).status_code == wait_for:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{module} did not answer {wait_for} on /health:\n{log_file.read_text()[-3000:]}"
                )
            time.sleep(0.3)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
