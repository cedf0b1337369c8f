"""Generated malformed requests for scenario 4 (tests/test_reliability_hostile.py, scripts/soak.py).

Each case is a request and the field its rejection must name; `field=None` marks input that is odd but valid
(stereo, 8 or 48 kHz audio, a BLS's optional inputs left out): it may be served or rejected, never a 5xx.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field

import numpy as np
import soundfile

INPUTS = ("reference_wav", "reference_wav_len", "reference_text", "target_text")
DTYPES = (np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.float32, object)
EXPECTED_DTYPE = {"reference_wav": np.float32, "reference_wav_len": np.int32, "reference_text": object}
EXPECTED_DTYPE["target_text"] = object


@dataclass
class TensorCase:
    name: str
    arrays: dict[str, np.ndarray]
    field: str | None


@dataclass
class ApiCase:
    name: str
    method: str  # "speech" (JSON body) | "voice" (multipart upload) | "raw" (bytes to /v1/audio/speech)
    body: object = None
    files: dict = field(default_factory=dict)
    data: dict = field(default_factory=dict)
    field: str | None = None  # the `param` (or a word of the message) the 4xx must name


def _text(value: bytes | str) -> np.ndarray:
    return np.array([[value.encode() if isinstance(value, str) else value]], dtype=object)


def _cast(value: np.ndarray, dtype) -> np.ndarray:
    if dtype is object:
        return np.array([[b"1"] * value.shape[-1]] if value.ndim == 2 else [b"1"], dtype=object)
    if value.dtype == object:
        return np.ones(value.shape, dtype=dtype)
    return value.astype(dtype)


def tensor_cases(
    base: dict[str, np.ndarray],
    rng: random.Random,
    count: int,
    optional_reference: bool,
    optional_length: bool,
):
    """`count` malformed variants of `base` (the four BLS inputs), cycling through the kinds of defect; the
    target model may take no reference at all (`optional_reference`) or a reference_wav without its length."""
    wav = base["reference_wav"]
    n = wav.shape[1]

    def with_(**changes) -> dict[str, np.ndarray]:
        return {k: v for k, v in ({**base, **changes}).items() if v is not None}

    def wav_with(values: np.ndarray) -> dict[str, np.ndarray]:
        values = values.astype(np.float32).reshape(1, -1)
        return with_(reference_wav=values, reference_wav_len=np.array([[values.shape[1]]], dtype=np.int32))

    def bad_samples(value: float) -> np.ndarray:
        out = wav.copy()
        out[0, rng.randrange(n)] = value
        return out

    makers = [
        lambda: (f"dtype of {(i := rng.choice(INPUTS))}", None, i),
        lambda: (f"missing {(i := rng.choice(INPUTS))}", with_(**{i: None}), i),
        lambda: ("extra tensor", with_(extra_input=np.zeros((1, 3), np.float32)), "extra_input"),
        lambda: (
            "reference_wav_len two values",
            with_(reference_wav_len=np.array([[n, n]], np.int32)),
            "reference_wav_len",
        ),
        lambda: ("target_text two strings", with_(target_text=_text("a").repeat(2, axis=1)), "target_text"),
        lambda: (
            "reference_wav length 0",
            with_(reference_wav_len=np.array([[0]], np.int32)),
            "reference_wav_len",
        ),
        lambda: (
            "reference_wav length past end",
            with_(reference_wav_len=np.array([[n + rng.randrange(1, 10**6)]], np.int32)),
            "reference_wav_len",
        ),
        lambda: (
            "reference_wav length negative",
            with_(reference_wav_len=np.array([[-rng.randrange(1, 10**6)]], np.int32)),
            "reference_wav_len",
        ),
        lambda: ("NaN sample", wav_with(bad_samples(np.nan)), "reference_wav"),
        lambda: ("Inf sample", wav_with(bad_samples(rng.choice([np.inf, -np.inf]))), "reference_wav"),
        lambda: ("one sample", wav_with(np.array([0.1])), None),  # odd but valid: served or a 4xx
        lambda: ("silent audio", wav_with(np.zeros(rng.randrange(1600, 48000))), None),
        lambda: ("huge amplitude", wav_with(wav[0] * 1e6), None),
        lambda: ("empty target_text", with_(target_text=_text(rng.choice(["", " ", "\n\t"]))), "target_text"),
        lambda: (
            "huge target_text",
            with_(target_text=_text("语" * rng.randrange(2000, 20000))),
            "target_text",
        ),
        lambda: (
            "invalid UTF-8 target_text",
            with_(target_text=_text(rng.choice([b"\xff\xfe", b"ab\xc3", b"\xed\xa0\x80"]))),
            "target_text",
        ),
        lambda: (
            "invalid UTF-8 reference_text",
            with_(reference_text=_text(b"\x80" * rng.randrange(1, 9))),
            "reference_text",
        ),
        lambda: (
            "huge reference_text",
            with_(reference_text=_text("x" * rng.randrange(2000, 9000))),
            "reference_text",
        ),
        lambda: (
            "two audios in one request",
            with_(reference_wav=np.repeat(wav, 2, axis=0)),
            "reference_wav",
        ),
    ]
    cases = []
    for i in range(count):
        name, arrays, fld = makers[i % len(makers)]()
        if arrays is None:  # a dtype case: the chosen input in another dtype
            dtype = rng.choice([d for d in DTYPES if d is not EXPECTED_DTYPE[fld]])
            arrays = with_(**{fld: _cast(base[fld], dtype)})
            name += f" as {getattr(dtype, '__name__', dtype)}"
        if name.startswith("missing") and fld != "target_text" and optional_reference:
            fld = None  # CosyVoice2 speaks with its spk2info speaker when the reference is left out
        if name == "missing reference_wav_len" and optional_length:
            fld = None  # the CosyVoice2 BLS models take the whole reference_wav then
        cases.append(TensorCase(name, arrays, fld))
    return cases


def long_audio_case(base: dict[str, np.ndarray], seconds: float = 600.0, rate: int = 16000) -> TensorCase:
    wav = np.zeros((1, int(seconds * rate)), np.float32)
    arrays = {**base, "reference_wav": wav, "reference_wav_len": np.array([[wav.shape[1]]], np.int32)}
    return TensorCase(f"{seconds:.0f} s reference", arrays, "reference_wav")


def wav_bytes(samples: np.ndarray, rate: int, subtype: str = "PCM_16") -> bytes:
    out = io.BytesIO()
    soundfile.write(out, samples, rate, subtype=subtype, format="WAV")
    return out.getvalue()


def api_cases(rng: random.Random, count: int, good_wav: bytes, voice: str, model: str) -> list[ApiCase]:
    tone = (0.3 * np.sin(np.arange(16000 * 2) / 10.0)).astype(np.float32)
    good = {"model": model, "input": "你好。", "voice": voice, "response_format": "pcm"}

    def speech(case, fld, **changes):
        body = {k: v for k, v in ({**good, **changes}).items() if v is not ...}
        return ApiCase(case, "speech", body=body, field=fld)

    def upload(case, fld, audio=good_wav, **data):
        """A voice upload; `data` overrides its form fields (`name`, `transcript`; `...` leaves one out)."""
        values = {"name": f"v{rng.randrange(10**9)}", "transcript": "你好。"} | data
        values = {k: v for k, v in values.items() if v is not ...}
        files = {} if audio is None else {"audio_sample": ("a.wav", audio, "audio/wav")}
        return ApiCase(case, "voice", files=files, data=values, field=fld)

    makers = [
        lambda: speech("missing input", "input", input=...),
        lambda: speech("missing voice", "voice", voice=...),
        lambda: speech("missing model", "model", model=...),
        lambda: speech("input not a string", "input", input=rng.choice([123, None, [], {"a": 1}, 1.5])),
        lambda: speech("voice not a string", "voice", voice=rng.choice([5, [], None])),
        lambda: speech("empty input", "input", input=rng.choice(["", "   ", "\n"])),
        lambda: speech("input too long", "input", input="语" * rng.randrange(5000, 9000)),
        lambda: speech("unknown voice", "voice", voice=f"nobody{rng.randrange(999)}"),
        lambda: speech(
            "voice with a path",
            "voice",
            voice=rng.choice(["../zh", "a/b", "..\\zh", "/etc/passwd", "zh.wav", ".", "..", "%2e%2e"]),
        ),
        lambda: speech("unknown model", "model", model=rng.choice(["tts-1", "../spark", ""])),
        lambda: speech(
            "bad response_format", "response_format", response_format=rng.choice(["wma", "", "WAV ", "../x"])
        ),
        lambda: speech("bad stream_format", "stream_format", stream_format=rng.choice(["chunks", "", "SSE"])),
        lambda: speech("speed", "speed", speed=rng.choice([0.0, -1.0, 4.5, "fast"])),
        lambda: ApiCase(
            "not JSON",
            "raw",
            body=rng.choice([b"{", b"model=x", b"\xff\xfe\x00", b"null", b"[]", b'"x"']),
            field="json",
        ),
        lambda: ApiCase(
            "invalid UTF-8 in JSON",
            "raw",
            body=b'{"model":"' + model.encode() + b'","input":"\xff\xfe","voice":"x"}',
            field="json",
        ),
        lambda: upload("upload without audio", "audio_sample", audio=None),
        lambda: upload("upload without name", "name", name=...),
        lambda: upload("upload without transcript", "transcript", transcript=...),
        lambda: upload(
            "upload name with a path",
            "name",
            name=rng.choice(["../x", "a/b", "..", ".x", "a\\b", "x" * 65, "é"]),
        ),
        lambda: upload("upload empty audio", "audio_sample", audio=b""),
        lambda: upload(
            "upload garbage audio", "audio_sample", audio=bytes(rng.randrange(256) for _ in range(2000))
        ),
        lambda: upload("upload truncated WAV", "audio_sample", audio=good_wav[: rng.randrange(10, 60)]),
        lambda: upload(
            "upload NaN WAV",
            "audio_sample",
            audio=wav_bytes(np.where(np.arange(tone.size) % 7 == 0, np.nan, tone), 16000, "FLOAT"),
        ),
        lambda: upload("upload silent WAV", None, audio=wav_bytes(np.zeros(32000), 16000)),  # odd but valid
        lambda: upload("upload one-sample WAV", "audio_sample", audio=wav_bytes(np.array([0.1]), 16000)),
        lambda: upload("upload 40 s WAV", "audio_sample", audio=wav_bytes(np.zeros(8000 * 40) + 0.1, 8000)),
        lambda: upload("upload stereo WAV", None, audio=wav_bytes(np.stack([tone, tone], 1), 16000)),
        lambda: upload("upload 8 kHz WAV", None, audio=wav_bytes(tone[::2], 8000)),
        lambda: upload("upload 48 kHz WAV", None, audio=wav_bytes(np.repeat(tone, 3), 48000)),
        lambda: upload("upload empty transcript", "transcript", transcript=" "),
    ]
    return [makers[i % len(makers)]() for i in range(count)]
