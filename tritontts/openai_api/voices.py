"""Voices: a folder of `NAME.wav` (reference audio) + `NAME.txt` (its transcript), and uploads into it.

A voice is read once and kept as the same float32 samples, so every request with it sends the same reference
audio and the BLS's voice cache (keyed by the audio's content) serves its tokens after the first request.
"""

from __future__ import annotations

import io
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

from tritontts.audio import AudioError, AudioLimits, check_waveform, load_wav, to_mono
from tritontts.bench.triton_io import REFERENCE_SAMPLE_RATE
from tritontts.dsp.resample import resample
from tritontts.openai_api.errors import ApiError, bad_request

VOICE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Voice:
    name: str
    transcript: str
    samples: np.ndarray  # mono float32 at REFERENCE_SAMPLE_RATE
    created_at: int

    def description(self) -> dict:
        return {
            "id": self.name,
            "object": "audio.voice",
            "name": self.name,
            "type": "audio_sample",
            "created_at": self.created_at,
            "transcript": self.transcript,
            "duration": round(self.samples.size / REFERENCE_SAMPLE_RATE, 3),
        }


def voice_not_found(name: str, param: str = "voice") -> ApiError:
    return ApiError(404, f"voice '{name}' not found (see GET /v1/audio/voices)", param, "voice_not_found")


class VoiceStore:
    def __init__(self, directory: Path, limits: AudioLimits, max_transcript_chars: int) -> None:
        self.directory = Path(directory)
        self.limits = limits
        self.max_transcript_chars = max_transcript_chars
        self._loaded: dict[str, tuple[tuple[float, float], Voice]] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(
            p.stem
            for p in self.directory.glob("*.wav")
            if VOICE_NAME.match(p.stem) and p.with_suffix(".txt").is_file()
        )

    def all(self) -> list[Voice]:
        voices = []
        for name in self.names():
            try:
                voices.append(self.get(name))
            except ApiError:
                continue  # unreadable files are left out of the list; asking for them says why
        return voices

    def get(self, name: str) -> Voice:
        if not isinstance(name, str) or not VOICE_NAME.match(name):
            raise voice_not_found(str(name))
        wav, txt = self.directory / f"{name}.wav", self.directory / f"{name}.txt"
        try:
            stamp = (wav.stat().st_mtime, txt.stat().st_mtime)
        except OSError:
            raise voice_not_found(name) from None
        with self._lock:
            cached = self._loaded.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            samples = load_wav(wav, REFERENCE_SAMPLE_RATE, self.limits, name=f"voice '{name}'")
        except AudioError as err:
            raise ApiError(500, f"voice '{name}' cannot be used: {err}", "voice", "voice_unreadable") from err
        voice = Voice(name, txt.read_text(encoding="utf-8").strip(), samples, int(stamp[0]))
        with self._lock:
            self._loaded[name] = (stamp, voice)
        return voice

    def add(self, name: str, audio: bytes, transcript: str) -> Voice:
        """Checks and stores an uploaded voice as NAME.wav (16-bit, its own rate) and NAME.txt."""
        if not VOICE_NAME.match(name or ""):
            raise bad_request("name must be 1-64 letters, digits, '_' or '-'", "name")
        transcript = (transcript or "").strip()
        if not transcript:
            raise bad_request("transcript (the text spoken in the audio sample) is required", "transcript")
        if len(transcript) > self.max_transcript_chars:
            raise bad_request(
                f"transcript has {len(transcript)} characters; at most {self.max_transcript_chars} are accepted",
                "transcript",
                code="string_above_max_length",
            )
        wav, rate = _decode(audio)
        try:
            check_waveform(
                resample(wav, rate, REFERENCE_SAMPLE_RATE), REFERENCE_SAMPLE_RATE, self.limits, "audio_sample"
            )
        except AudioError as err:
            raise bad_request(str(err), "audio_sample", code="invalid_audio") from err
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock:
            target = self.directory / f"{name}.wav"
            if target.exists():
                raise ApiError(409, f"voice '{name}' already exists", "name", "voice_exists")
            (self.directory / f"{name}.txt").write_text(transcript + "\n", encoding="utf-8")
            partial = self.directory / f".{name}.{os.getpid()}.{time.monotonic_ns()}.wav"
            soundfile.write(partial, wav, rate, subtype="PCM_16", format="WAV")
            partial.replace(target)
        return self.get(name)


def _decode(audio: bytes) -> tuple[np.ndarray, int]:
    if not audio:
        raise bad_request("audio_sample is empty", "audio_sample", code="invalid_audio")
    try:
        wav, rate = soundfile.read(io.BytesIO(audio), dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise bad_request(
            f"audio_sample is not audio that libsndfile reads (WAV, FLAC, OGG, MP3): {err}",
            "audio_sample",
            code="invalid_audio",
        ) from err
    return to_mono(wav).astype(np.float32), int(rate)
