"""Starting `python -m tritontts.openai_api` on a free loopback port for tests, and decoding its audio."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import soundfile
from http_service import http_service

UNKNOWN_LENGTH = 2**63 - 1  # what libsndfile reports for a FLAC stream whose STREAMINFO has no length


def api_process(*args: str, log_file: Path, wait_for: int = 200):
    """The API's base URL once `/health` answers `wait_for`; the process ends on exit."""
    return http_service("tritontts.openai_api", [*args, "--log-level", "warning"], log_file, wait_for)


def zh_voices(directory: Path, wav: Path, transcript: str) -> Path:
    """`directory` as the API's `--voices-dir`: one voice `zh` (`wav` copied, `transcript` beside it)."""
    shutil.copy(wav, directory / "zh.wav")
    (directory / "zh.txt").write_text(transcript + "\n", encoding="utf-8")
    return directory


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
