"""Audio bytes in the formats of OpenAI's speech API, whole or as a stream, through libsndfile (soundfile).

The libsndfile bundled in the soundfile wheels (1.2+) writes all of them: WAV and FLAC always, MP3
(MPEG_LAYER_III, LAME) since 1.1, OGG/OPUS since 1.0.29. AAC has no encoder there and is refused. Opus takes
only 8/12/16/24/48 kHz, so other model rates are resampled to 48 kHz for it.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import soundfile

from tritontts.dsp.resample import resample

OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


@dataclass(frozen=True)
class AudioFormat:
    name: str
    media_type: str
    sndfile_format: str | None = None
    subtype: str | None = None


FORMATS = {
    "wav": AudioFormat("wav", "audio/wav", "WAV", "PCM_16"),
    "pcm": AudioFormat("pcm", "audio/pcm"),
    "flac": AudioFormat("flac", "audio/flac", "FLAC", "PCM_16"),
    "mp3": AudioFormat("mp3", "audio/mpeg", "MP3", "MPEG_LAYER_III"),
    "opus": AudioFormat("opus", "audio/ogg", "OGG", "OPUS"),
}
UNSUPPORTED = {"aac": "libsndfile has no AAC encoder"}


@lru_cache(maxsize=1)
def missing_formats() -> tuple[str, ...]:
    """Formats whose encoder the installed libsndfile lacks (empty with the soundfile wheels' libsndfile)."""
    missing = []
    for fmt in FORMATS.values():
        if fmt.sndfile_format and fmt.subtype not in soundfile.available_subtypes(fmt.sndfile_format):
            missing.append(fmt.name)
    return tuple(missing)


def pcm16(samples: np.ndarray) -> bytes:
    """Mono 16-bit little-endian PCM, as OpenAI's `pcm` format."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return np.rint(clipped * 32767.0).astype("<i2").tobytes()


def streaming_wav_header(sample_rate: int) -> bytes:
    """A 16-bit mono WAV header whose RIFF and data sizes are 0xFFFFFFFF (unknown length), as streamed WAVs are."""
    unknown = 0xFFFFFFFF
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", unknown)
    )


def _sndfile_args(fmt: AudioFormat, sample_rate: int) -> dict:
    args: dict = {
        "samplerate": sample_rate,
        "channels": 1,
        "format": fmt.sndfile_format,
        "subtype": fmt.subtype,
    }
    if fmt.name == "mp3":
        # Constant bitrate: readers that estimate an MP3's length from its first frame get it right.
        args.update(bitrate_mode="CONSTANT", compression_level=0.5)
    return args


def _encoder_rate(fmt: AudioFormat, sample_rate: int) -> int:
    return 48000 if fmt.name == "opus" and sample_rate not in OPUS_RATES else sample_rate


def _prepare(samples: np.ndarray, sample_rate: int, rate: int) -> np.ndarray:
    samples = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return resample(samples, sample_rate, rate) if rate != sample_rate and samples.size else samples


def encode(samples: np.ndarray, sample_rate: int, format_name: str) -> bytes:
    """A whole file of `samples` (mono float in [-1, 1]) in `format_name`."""
    fmt = FORMATS[format_name]
    if fmt.sndfile_format is None:
        return pcm16(samples)
    rate = _encoder_rate(fmt, sample_rate)
    buffer = io.BytesIO()
    with soundfile.SoundFile(buffer, "w", **_sndfile_args(fmt, rate)) as out:
        out.write(_prepare(samples, sample_rate, rate))
    return buffer.getvalue()


class _AppendOnlySink:
    """A seekable file for libsndfile that hands out each byte once, in order, as it is written.

    libsndfile patches headers (FLAC STREAMINFO, MP3's Xing frame) by seeking back on close; bytes already
    handed out stay as they were, which leaves the stream's length unknown, as in any live stream.
    """

    def __init__(self) -> None:
        self.pending = bytearray()
        self.sent = 0
        self.position = 0
        self.end = 0

    def write(self, data: bytes) -> int:
        data = bytes(data)
        start, self.position = self.position, self.position + len(data)
        self.end = max(self.end, self.position)
        first = max(start, self.sent)
        if first < self.position:
            needed = self.position - self.sent
            if needed > len(self.pending):
                self.pending.extend(bytes(needed - len(self.pending)))
            self.pending[first - self.sent : needed] = data[first - start :]
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.position = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.end}[whence] + offset
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        data, self.pending = bytes(self.pending), bytearray()
        self.sent += len(data)
        return data


class StreamEncoder:
    """Encodes audio chunk by chunk: `push` returns the bytes ready so far, `finish` the rest.

    wav is a header of unknown length then 16-bit PCM; pcm is the PCM alone; flac, mp3 and opus go through
    libsndfile as one continuous file, so a player sees one stream (Ogg pages come out as they fill).
    """

    def __init__(self, format_name: str, sample_rate: int) -> None:
        self.format = FORMATS[format_name]
        self.sample_rate = sample_rate
        self.rate = _encoder_rate(self.format, sample_rate)
        self._started = False
        self._sink: _AppendOnlySink | None = None
        self._file: soundfile.SoundFile | None = None
        if self.format.name not in ("wav", "pcm"):
            self._sink = _AppendOnlySink()
            self._file = soundfile.SoundFile(self._sink, "w", **_sndfile_args(self.format, self.rate))

    def _header(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return streaming_wav_header(self.sample_rate) if self.format.name == "wav" else b""

    def push(self, samples: np.ndarray) -> bytes:
        if self._file is None:
            return self._header() + pcm16(samples)
        self._file.write(_prepare(samples, self.sample_rate, self.rate))
        return self._sink.take()

    def finish(self) -> bytes:
        if self._file is None:
            return self._header()
        self._file.close()
        return self._sink.take()
