"""Starting `python -m tritontts.openai_api` on a free loopback port for tests, and decoding its audio."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import soundfile

from tritontts.triton.server import free_ports

UNKNOWN_LENGTH = 2**63 - 1  # what libsndfile reports for a FLAC stream whose STREAMINFO has no length


@contextmanager
def api_process(*args: str, log_file: Path, wait_for: int = 200) -> Iterator[str]:
    """The API's base URL once `/health` answers `wait_for`; the process ends on exit."""
    (port,) = free_ports(1)
    command = [
        sys.executable,
        "-m",
        "tritontts.openai_api",
        "--port",
        str(port),
        "--log-level",
        "warning",
        *args,
    ]
    with open(log_file, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the API exited with {process.returncode}:\n{log_file.read_text()[-3000:]}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=10).status_code == wait_for:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the API did not answer {wait_for} on /health:\n{log_file.read_text()[-3000:]}"
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


def decode(data: bytes, response_format: str, pcm_rate: int) -> tuple[np.ndarray, int]:
    """Samples and rate of an API response body; pcm is 16-bit little-endian mono at `pcm_rate`."""
    if response_format == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0, pcm_rate
    with soundfile.SoundFile(io.BytesIO(data)) as audio:
        if audio.frames != UNKNOWN_LENGTH:
            return audio.read(dtype="float32"), audio.samplerate
        # soundfile seeks after every read, which fails at the end of a stream of unknown length; libsndfile's
        # own read does not, so read through it until it returns nothing.
        blocks = []
        while True:
            block = np.zeros(4096, dtype=np.float32)
            pointer = soundfile._ffi.cast("float *", block.ctypes.data)
            count = soundfile._snd.sf_readf_float(audio._file, pointer, block.size)
            if count <= 0:
                return np.concatenate(blocks), audio.samplerate
            blocks.append(block[:count])
