import numpy as np
import pytest

from tritontts.streaming import ChunkSchedule, TokenChunker, crossfade_concat
from tritontts.voice_cache import VoiceCache, audio_key


def upstream_schedule() -> ChunkSchedule:
    return ChunkSchedule.from_durations(1.0, 30.0, 8.0, 0.1, token_rate=50)


def test_schedule_from_upstream_defaults():
    assert upstream_schedule() == ChunkSchedule(first_tokens=50, max_tokens=1500, scale=8.0, overlap_tokens=5)


@pytest.mark.parametrize("bad", [dict(scale=0.5), dict(chunk_seconds=0.0), dict(overlap_seconds=2.0)])
def test_schedule_rejects_bad_values(bad):
    args = dict(chunk_seconds=1.0, max_chunk_seconds=30.0, scale=8.0, overlap_seconds=0.1, token_rate=50)
    args.update(bad)
    with pytest.raises(ValueError):
        ChunkSchedule.from_durations(**args)


def test_chunker_sizes_grow_and_overlap():
    chunker = TokenChunker(ChunkSchedule(first_tokens=4, max_tokens=10, scale=2.0, overlap_tokens=1))
    tokens = list(range(30))
    chunks = [c for t in tokens for c in chunker.push([t])]
    last = chunker.finish()
    assert [len(c) for c in chunks] == [4, 8, 10, 10]
    assert chunks[0] == [0, 1, 2, 3] and chunks[1][0] == 3 and chunks[2][0] == chunks[1][-1]
    assert last == list(range(chunks[-1][-1], 30))
    covered = chunks[0] + [t for c in chunks[1:] + [last] for t in c[1:]]
    assert covered == tokens


def test_chunker_short_stream_is_one_final_chunk():
    chunker = TokenChunker(ChunkSchedule(first_tokens=50, max_tokens=100, scale=2.0, overlap_tokens=5))
    assert list(chunker.push(range(20))) == []
    assert chunker.finish() == list(range(20))


def test_chunker_skips_a_final_chunk_of_overlap_only():
    chunker = TokenChunker(ChunkSchedule(first_tokens=4, max_tokens=4, scale=1.0, overlap_tokens=1))
    assert len(list(chunker.push(range(4)))) == 1
    assert chunker.finish() is None


def test_crossfade_matches_upstream_client_arithmetic():
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal(n).astype(np.float32) for n in (100, 160, 90)]
    out = crossfade_concat(chunks, overlap_samples=10)
    assert out.shape == (100 + 160 + 90 - 2 * 10,)
    np.testing.assert_array_equal(out[:90], chunks[0][:90])
    np.testing.assert_allclose(out[90], chunks[0][90])  # fade starts on the previous chunk
    np.testing.assert_allclose(out[99], chunks[1][9])  # and ends on the next one
    np.testing.assert_array_equal(out[-10:], chunks[2][-10:])


def test_crossfade_of_identical_overlaps_is_seamless():
    signal = np.sin(np.linspace(0, 40, 500)).astype(np.float32)
    chunks = [signal[0:200], signal[190:350], signal[340:500]]
    np.testing.assert_allclose(crossfade_concat(chunks, 10), signal, atol=1e-6)


def test_voice_cache_lru_and_counts():
    cache: VoiceCache[int] = VoiceCache(capacity=2)
    keys = [audio_key(np.full(10, i, np.float32), 16000) for i in range(3)]
    assert len(set(keys)) == 3
    assert audio_key(np.full(10, 0, np.float64), 16000) == keys[0]
    assert audio_key(np.full(10, 0, np.float32), 24000) != keys[0]
    cache.put(keys[0], 0)
    cache.put(keys[1], 1)
    assert cache.get(keys[0]) == 0
    cache.put(keys[2], 2)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) == 0 and cache.get(keys[2]) == 2
    assert (cache.hits, cache.misses, len(cache)) == (3, 1, 2)
