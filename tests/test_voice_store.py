"""Voice files and profiles without a server: the voices folder's writes, names and deletes, profile files,
the checkpoint marker, OpenAI speed to Spark-TTS speed levels, and ref_audio decoding."""

from __future__ import annotations

import base64
import io
import threading

import numpy as np
import pytest
import soundfile

from tritontts.audio import AudioLimits
from tritontts.openai_api.errors import ApiError
from tritontts.openai_api.speech import speed_level
from tritontts.openai_api.voice_request import decode_ref_audio
from tritontts.openai_api.voices import VoiceStore
from tritontts.voice_profile import ProfileError, VoiceProfile, checkpoint_marker


def wav_bytes(seconds: float = 1.0, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    soundfile.write(buffer, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return buffer.getvalue()


def spark_profile(marker: str = "a" * 24) -> VoiceProfile:
    arrays = {"global_tokens": np.arange(32, dtype=np.int32), "semantic_tokens": np.arange(7, dtype=np.int32)}
    return VoiceProfile("spark_tts", marker, arrays)


@pytest.fixture
def store(tmp_path) -> VoiceStore:
    return VoiceStore(tmp_path / "voices", AudioLimits(max_seconds=5.0), 200)


def test_speed_levels():
    expected = {
        0.25: "very_low",
        0.6: "very_low",
        0.625: "low",
        0.75: "low",
        1.0: "moderate",
        1.1: "moderate",
    }
    expected |= {1.125: "high", 1.25: "high", 1.375: "very_high", 1.5: "very_high", 4.0: "very_high"}
    assert {speed: speed_level(speed) for speed in expected} == expected


def test_ref_audio_is_base64_or_a_data_uri_never_a_url():
    data = wav_bytes(0.1)
    assert decode_ref_audio(base64.b64encode(data).decode()) == data
    assert decode_ref_audio("data:audio/wav;base64," + base64.b64encode(data).decode()) == data
    assert decode_ref_audio(data) == data
    for bad in ("https://example.com/a.wav", "/etc/passwd", "not base64!", "data:audio/wav,abc"):
        with pytest.raises(ApiError) as error:
            decode_ref_audio(bad)
        assert error.value.status == 400 and error.value.param == "ref_audio"


def test_add_get_delete(store):
    voice = store.add("alice", wav_bytes(), "  hello  ")
    assert voice.transcript == "hello" and voice.samples.size == 16000
    assert store.names() == ["alice"]
    assert not [p for p in store.directory.iterdir() if p.name.startswith(".")]  # no temporary file left
    store.save_profile("alice", spark_profile())
    assert store.profile_kinds("alice") == ["spark_tts"]
    store.delete("alice")
    assert store.names() == [] and list(store.directory.iterdir()) == []
    with pytest.raises(ApiError) as error:
        store.delete("alice")
    assert error.value.status == 404
    with pytest.raises(ApiError):
        store.get("alice")


def test_a_taken_name_is_409_and_concurrent_uploads_have_one_winner(store):
    store.add("bob", wav_bytes(), "one")
    with pytest.raises(ApiError) as error:
        store.add("bob", wav_bytes(), "two")
    assert error.value.status == 409 and store.get("bob").transcript == "one"
    results: list = []
    barrier = threading.Barrier(4)

    def upload(index: int) -> None:
        barrier.wait()
        try:
            results.append(store.add("carol", wav_bytes(), f"take {index}").transcript)
        except ApiError as err:
            results.append(err.status)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results, key=str).count(409) == 3
    (winner,) = [r for r in results if r != 409]
    assert store.get("carol").transcript == winner


def test_upload_checks(store):
    with pytest.raises(ApiError, match="at most 5"):
        store.add("long", wav_bytes(6.0), "x")
    with pytest.raises(ApiError, match="transcript"):
        store.add("empty", wav_bytes(), "  ")
    with pytest.raises(ApiError, match="name"):
        store.add("../x", wav_bytes(), "x")
    assert store.names() == []


def test_profiles_round_trip_and_are_checked(store):
    profile = spark_profile()
    again = VoiceProfile.from_bytes(profile.to_bytes())
    assert again.kind == "spark_tts" and again.checkpoint == profile.checkpoint
    assert np.array_equal(again.arrays["global_tokens"], profile.arrays["global_tokens"])
    arrays = profile.request_arrays()
    assert arrays["voice_global_tokens"].shape == (1, 32) and arrays["voice_checkpoint"].shape == (1, 1)
    with pytest.raises(ProfileError, match="needs semantic_tokens"):
        VoiceProfile("spark_tts", "m", {"global_tokens": np.zeros(32)})
    with pytest.raises(ProfileError, match="not a voice profile"):
        VoiceProfile.from_bytes(b"garbage")
    store.save_profile("nobody", profile)  # a deleted voice gets no profile back
    assert not store.profile_path("nobody", "spark_tts").exists()
    store.add("dave", wav_bytes(), "x")
    store.profile_path("dave", "spark_tts").write_bytes(b"broken")
    assert store.profile("dave", "spark_tts") is None  # unreadable: the request sends the audio instead


def test_checkpoint_marker_follows_the_files(tmp_path):
    (tmp_path / "LLM").mkdir()
    (tmp_path / "LLM" / "model.safetensors").write_bytes(b"llm")
    (tmp_path / "BiCodec").mkdir()
    weights = tmp_path / "BiCodec" / "model.safetensors"
    weights.write_bytes(b"x" * 3_000_000)
    marker = checkpoint_marker(tmp_path, exclude=[tmp_path / "LLM"])
    (tmp_path / "LLM" / "model.safetensors").write_bytes(b"another llm")
    assert checkpoint_marker(tmp_path, exclude=[tmp_path / "LLM"]) == marker
    weights.write_bytes(b"x" * 2_999_999 + b"y")
    assert checkpoint_marker(tmp_path, exclude=[tmp_path / "LLM"]) != marker
