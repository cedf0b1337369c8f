"""The voice store the BLS instances of one model share: values round-trip as their dataclasses, files appear
whole (temporary file, rename), the least recently used go past the capacity, a bad file or key is refused, and
two caches over one store compute a voice once."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from tritontts.cosyvoice2.request import Voice
from tritontts.spark.service import VoiceTokens
from tritontts.voice_cache import VoiceCache, audio_key
from tritontts.voice_store import SharedVoiceStore, server_folder, voice_store


def _key(n: int) -> str:
    return audio_key(np.full(10, n, dtype=np.float32), 16000)


def _voice(seed: int, with_wav: bool = False) -> Voice:
    rng = np.random.default_rng(seed)
    return Voice(
        "",
        rng.integers(0, 6561, 25).astype(np.int32),
        rng.standard_normal((50, 80)).astype(np.float32),
        rng.standard_normal(192).astype(np.float32),
        rng.standard_normal(16000).astype(np.float32) if with_wav else None,
    )


@pytest.mark.parametrize("with_wav", [False, True])
def test_a_voice_round_trips(tmp_path: Path, with_wav: bool) -> None:
    store = SharedVoiceStore(tmp_path / "voices", Voice)
    voice = _voice(1, with_wav)
    store.save(_key(1), voice)
    loaded = store.load(_key(1))
    assert loaded is not None and loaded.text == ""
    for name in ("speech_tokens", "speech_feat", "embedding"):
        got, expected = getattr(loaded, name), getattr(voice, name)
        assert got.dtype == expected.dtype and np.array_equal(got, expected)
    assert (loaded.reference_wav is None) == (not with_wav)
    assert list((tmp_path / "voices").iterdir()) == [tmp_path / "voices" / f"{_key(1)}.npz"]
    assert (tmp_path / "voices").stat().st_mode & 0o777 == 0o700


def test_spark_voice_tokens_round_trip(tmp_path: Path) -> None:
    store = SharedVoiceStore(tmp_path, VoiceTokens)
    tokens = VoiceTokens(np.arange(32, dtype=np.int32), np.arange(100, dtype=np.int32))
    store.save(_key(2), tokens)
    loaded = store.load(_key(2))
    assert np.array_equal(loaded.global_tokens, tokens.global_tokens)
    assert np.array_equal(loaded.semantic_tokens, tokens.semantic_tokens)


def test_the_least_recently_used_go_past_the_capacity(tmp_path: Path) -> None:
    store = SharedVoiceStore(tmp_path, VoiceTokens, capacity=2)
    for n in range(3):
        store.save(_key(n), VoiceTokens(np.array([n]), np.array([n])))
        past = time.time() - 100 + 10 * n
        os.utime(tmp_path / f"{_key(n)}.npz", (past, past))
    assert len(store) == 2 and store.load(_key(0)) is None
    assert store.load(_key(1)) is not None  # read now: the most recently used
    store.save(_key(3), VoiceTokens(np.array([3]), np.array([3])))
    assert len(store) == 2 and store.load(_key(1)) is not None and store.load(_key(2)) is None


def test_an_unreadable_file_is_computed_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = SharedVoiceStore(tmp_path, Voice)
    (tmp_path / f"{_key(4)}.npz").write_bytes(b"not a zip file")
    assert store.load(_key(4)) is None
    assert "unreadable" in caplog.text
    np.savez(tmp_path / f"{_key(5)}.npz", speech_feat=np.zeros(3))  # a required field missing
    assert store.load(_key(5)) is None


@pytest.mark.parametrize("key", ["../../etc/passwd", "abc/def", "", "ZZ" * 32])
def test_keys_are_hex_digests_only(tmp_path: Path, key: str) -> None:
    store = SharedVoiceStore(tmp_path, Voice)
    with pytest.raises(ValueError, match="hex digest"):
        store.load(key)
    with pytest.raises(ValueError, match="hex digest"):
        store.save(key, _voice(0))


def test_two_instances_compute_a_voice_once(tmp_path: Path) -> None:
    first = VoiceCache(8, SharedVoiceStore(tmp_path, Voice))
    second = VoiceCache(8, SharedVoiceStore(tmp_path, Voice))
    computed = []

    def compute() -> Voice:
        computed.append(1)
        return _voice(6)

    value, hit = first.get_or_compute(_key(6), compute)
    again, hit_again = second.get_or_compute(_key(6), compute)
    assert (hit, hit_again, len(computed)) == (False, True, 1)
    assert np.array_equal(value.speech_feat, again.speech_feat)
    assert (second.hits, second.misses) == (1, 0) and len(second) == 1


def test_no_capacity_means_no_store(tmp_path: Path) -> None:
    cache = VoiceCache(0, SharedVoiceStore(tmp_path, Voice))
    cache.put(_key(7), _voice(7))
    assert cache.get(_key(7)) is None and not list(tmp_path.iterdir())


def test_the_server_folder_is_per_server_and_the_gone_ones_are_removed(tmp_path: Path) -> None:
    gone = tmp_path / "cosyvoice2-999999999"
    gone.mkdir()
    alive = tmp_path / f"cosyvoice2-{os.getpid()}"
    alive.mkdir()
    other_model = tmp_path / "spark_tts-999999999"
    other_model.mkdir()
    folder = server_folder("cosyvoice2", tmp_path)
    assert folder == tmp_path / f"cosyvoice2-{os.getppid()}"
    assert not gone.exists() and alive.exists() and other_model.exists()


def test_the_parameter(tmp_path: Path) -> None:
    assert voice_store("none", "m", Voice) is None
    assert voice_store(str(tmp_path / "v"), "m", Voice, capacity=0) is None
    store = voice_store(str(tmp_path / "v"), "m", Voice, capacity=3)
    assert store is not None and store.directory == tmp_path / "v" and store.capacity == 3
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert voice_store(str(blocked / "v"), "m", Voice) is None


def test_a_new_store_warms_up_in_memory_and_writes_nothing(tmp_path: Path) -> None:
    store = SharedVoiceStore(tmp_path / "voices", VoiceTokens)
    assert len(store) == 0 and list((tmp_path / "voices").iterdir()) == []
