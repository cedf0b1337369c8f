"""Voices: a folder of `NAME.wav` (reference audio) + `NAME.txt` (its transcript) + `NAME.KIND.npz` (its
profile per model family, tritontts.voice_profile), shared by every API replica; uploads and deletes.

A voice is read once and kept as the same float32 samples, so every request with it sends the same reference
audio and the BLS's voice cache (keyed by the audio's content) serves its tokens after the first request; with a
profile, requests send the profile instead and the BLS calls no front-end model at all.

Writes are atomic (a temporary file in the folder, fsync, then a link or rename), so a replica never reads half a
file. An upload claims its name by hard-linking its transcript to `NAME.txt`, which fails when the name exists,
even across processes and hosts of one shared folder: of two concurrent uploads of one name, one wins and the
other gets 409.
"""

from __future__ import annotations

import io
import logging
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
from tritontts.voice_profile import KIND_ARRAYS, ProfileError, VoiceProfile

VOICE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
log = logging.getLogger("tritontts.openai_api")


@dataclass(frozen=True)
class Voice:
    name: str
    transcript: str
    samples: np.ndarray  # mono float32 at REFERENCE_SAMPLE_RATE
    created_at: int

    def description(self, profiles: list[str] | None = None) -> dict:
        extra = {} if profiles is None else {"profiles": profiles}
        return extra | {
            "id": self.name,
            "object": "audio.voice",
            "name": self.name,
            "type": "audio_sample",
            "created_at": self.created_at,
            "transcript": self.transcript,
            "duration": round(self.samples.size / REFERENCE_SAMPLE_RATE, 3),
        }


def _temporary(directory: Path, name: str, suffix: str) -> Path:
    return directory / f".{name}.{os.getpid()}.{threading.get_ident()}.{time.monotonic_ns()}{suffix}"


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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

    def check_transcript(
        self, transcript: str | None, field: str = "transcript", required: bool = True
    ) -> str:
        transcript = (transcript or "").strip()
        if not transcript and required:
            raise bad_request(f"{field} (the text spoken in the audio sample) is required", field)
        if len(transcript) > self.max_transcript_chars:
            raise bad_request(
                f"{field} has {len(transcript)} characters; at most {self.max_transcript_chars} are accepted",
                field,
                code="string_above_max_length",
            )
        return transcript

    def reference(self, audio: bytes, field: str) -> tuple[np.ndarray, np.ndarray, int]:
        """Uploaded audio, checked as a voice's: 16 kHz samples, and the decoded audio at its own rate."""
        wav, rate = _decode(audio, field)
        try:
            samples = check_waveform(
                resample(wav, rate, REFERENCE_SAMPLE_RATE), REFERENCE_SAMPLE_RATE, self.limits, field
            )
        except AudioError as err:
            raise bad_request(str(err), field, code="invalid_audio") from err
        return samples.astype(np.float32), wav, rate

    def add(self, name: str, audio: bytes, transcript: str) -> Voice:
        """Checks and stores an uploaded voice as NAME.wav (16-bit, its own rate) and NAME.txt; 409 when the
        name is taken (by a concurrent upload too)."""
        if not VOICE_NAME.match(name or ""):
            raise bad_request("name must be 1-64 letters, digits, '_' or '-'", "name")
        transcript = self.check_transcript(transcript)
        _, wav, rate = self.reference(audio, "audio_sample")
        self.directory.mkdir(parents=True, exist_ok=True)
        text_part = _temporary(self.directory, name, ".txt")
        wav_part = _temporary(self.directory, name, ".wav")
        try:
            _write_synced(text_part, (transcript + "\n").encode("utf-8"))
            encoded = io.BytesIO()
            soundfile.write(encoded, wav, rate, subtype="PCM_16", format="WAV")
            _write_synced(wav_part, encoded.getvalue())
            if (self.directory / f"{name}.wav").exists():
                raise FileExistsError(name)
            os.link(text_part, self.directory / f"{name}.txt")  # the claim: fails if the name exists
            os.replace(wav_part, self.directory / f"{name}.wav")
            _sync_directory(self.directory)
        except FileExistsError:
            raise ApiError(409, f"voice '{name}' already exists", "name", "voice_exists") from None
        finally:
            for part in (text_part, wav_part):
                part.unlink(missing_ok=True)
        return self.get(name)

    def delete(self, name: str) -> None:
        """Removes the voice (audio first, so no replica sees it half gone), its transcript and profiles."""
        if not isinstance(name, str) or not VOICE_NAME.match(name):
            raise voice_not_found(str(name), "name")
        files = [self.directory / f"{name}.wav", self.directory / f"{name}.txt"]
        files += [self.profile_path(name, kind) for kind in KIND_ARRAYS]
        removed = False
        for path in files:
            try:
                path.unlink()
                removed = True
            except FileNotFoundError:
                continue
        if not removed:
            raise voice_not_found(name, "name")
        with self._lock:
            self._loaded.pop(name, None)
        _sync_directory(self.directory)

    def profile_kinds(self, name: str) -> list[str]:
        return [kind for kind in KIND_ARRAYS if self.profile_path(name, kind).is_file()]

    def profile_path(self, name: str, kind: str) -> Path:
        return self.directory / f"{name}.{kind}.npz"

    def profile(self, name: str, kind: str) -> VoiceProfile | None:
        """The voice's stored profile for a model family; None if there is none (or it cannot be read)."""
        path = self.profile_path(name, kind)
        try:
            profile = VoiceProfile.from_bytes(path.read_bytes(), str(path))
        except FileNotFoundError:
            return None
        except (OSError, ProfileError) as err:
            log.warning("voice '%s': profile %s is not used: %s", name, path.name, err)
            return None
        return profile if profile.kind == kind else None

    def save_profile(self, name: str, profile: VoiceProfile) -> None:
        """Atomically (re)writes the voice's profile for its family, if the voice still exists."""
        if not (self.directory / f"{name}.wav").exists():
            return
        part = _temporary(self.directory, name, ".npz")
        try:
            _write_synced(part, profile.to_bytes())
            os.replace(part, self.profile_path(name, profile.kind))
            _sync_directory(self.directory)
        finally:
            part.unlink(missing_ok=True)


def _decode(audio: bytes, field: str = "audio_sample") -> tuple[np.ndarray, int]:
    if not audio:
        raise bad_request(f"{field} is empty", field, code="invalid_audio")
    try:
        wav, rate = soundfile.read(io.BytesIO(audio), dtype="float32", always_2d=False)
    except (RuntimeError, soundfile.LibsndfileError) as err:
        raise bad_request(
            f"{field} is not audio that libsndfile reads (WAV, FLAC, OGG, MP3): {err}",
            field,
            code="invalid_audio",
        ) from err
    return to_mono(wav).astype(np.float32), int(rate)
