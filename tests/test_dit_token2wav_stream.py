"""DiTToken2Wav on the synthetic tiny token2wav folder: speaker preparation, offline audio, and streaming.

Chunks follow upstream's BLS: chunk k passes tokens[offset : offset + hop + 3] (its last 3 are look-ahead,
passed again at the start of the next chunk), the finalize call passes tokens[offset:].
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hift_models import constant_source_hift

from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.dit_token2wav import DiTSpeaker, DiTToken2Wav
from tritontts.dit_token2wav.token2wav import ESTIMATOR_CACHE_TAIL
from tritontts.synthetic.cosyvoice2 import voiced_signal
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

SAMPLES_PER_TOKEN = 960
FRAME = 480
NUM_TOKENS = 70
# HiFT sees 13 mel frames each side: around a call's right edge e (in mel frames) the streamed audio
# differs from one pass over the same mel within [e - 13, e - 8) (no right context past e), the
# cross-fade [e - 8, e) and [e, e + 5) (the next call's left context starts at e - 8); one frame of margin.
LEFT_OF_EDGE, RIGHT_OF_EDGE = 14, 6
SCHEDULES = [StreamSchedule(), StreamSchedule(exponential=True)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def t2w(tmp_path_factory: pytest.TempPathFactory) -> DiTToken2Wav:
    folder = write_dit_token2wav(tmp_path_factory.mktemp("dit_tiny"), "tiny", seed=0)
    return DiTToken2Wav.from_model_dir(folder, device="cpu")


@pytest.fixture(scope="module")
def speaker(t2w: DiTToken2Wav) -> DiTSpeaker:
    return t2w.prepare_speaker(voiced_signal(seconds=2.0, seed=1))


@pytest.fixture(scope="module")
def constant_source(t2w: DiTToken2Wav) -> DiTToken2Wav:
    """The same flow with a constant-source HiFT, so a streamed call and one pass vocode with the same source."""
    return DiTToken2Wav(t2w.flow, constant_source_hift())


def _targets(count: int = NUM_TOKENS, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, count).astype(np.int32)


def _stream(t2w: DiTToken2Wav, speaker: DiTSpeaker, tokens: np.ndarray, schedule: StreamSchedule, rid: str):
    return [
        t2w.stream(rid, speaker, tokens[chunk.token_offset : chunk.token_end], chunk.finalize)
        for chunk in schedule.plan(len(tokens))
    ]


def test_prepare_speaker_aligns_and_is_cached(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    # 2 s: 50 tokens (whisper frames // 4) and 100 mel frames at 24 kHz / 480.
    assert speaker.prompt_tokens.shape == (1, 50)
    assert speaker.prompt_mel.shape == (1, 100, 80) and speaker.prompt_frames == 100
    assert speaker.embedding.shape == (1, 192)
    assert speaker.cache.estimator.frames == 100
    assert speaker.cache.encoder.tokens == 50
    hits = t2w.speakers.hits
    assert t2w.prepare_speaker(voiced_signal(seconds=2.0, seed=1)) is speaker
    assert t2w.speakers.hits == hits + 1


def test_offline_length_is_960_samples_per_token(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    audio = t2w.offline(_targets(25), speaker)
    assert audio.dtype == np.float32 and audio.shape == (25 * SAMPLES_PER_TOKEN,)
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 0.99 and audio.std() > 1e-3
    np.testing.assert_array_equal(t2w.offline(_targets(25).tolist(), speaker), audio)
    assert t2w.offline([], speaker).shape == (0,)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=["fixed", "exponential"])
def test_stream_equals_one_hift_pass_outside_the_joins(
    constant_source: DiTToken2Wav, speaker: DiTSpeaker, schedule: StreamSchedule, monkeypatch
) -> None:
    flow = constant_source.flow
    chunk_mels = []
    real_chunks = flow.inference_chunks

    def recording(*args, **kwargs):
        results = real_chunks(*args, **kwargs)
        chunk_mels.extend(mel for mel, _ in results)
        return results

    monkeypatch.setattr(flow, "inference_chunks", recording)
    tokens = _targets()
    streamed = np.concatenate(_stream(constant_source, speaker, tokens, schedule, "join"))
    one_pass, _ = constant_source.hift.inference(torch.cat(chunk_mels, dim=2))
    one_pass = one_pass[0].numpy()
    assert streamed.shape == one_pass.shape == (NUM_TOKENS * SAMPLES_PER_TOKEN,)

    outside = np.ones(2 * NUM_TOKENS, dtype=bool)
    for chunk in schedule.plan(NUM_TOKENS)[:-1]:
        edge = 2 * (chunk.token_end - schedule.pre_lookahead_len)
        outside[edge - LEFT_OF_EDGE : edge + RIGHT_OF_EDGE] = False
    per_frame = np.abs(streamed - one_pass).reshape(-1, FRAME).max(axis=1)
    assert per_frame[outside].max() < 1e-5
    assert outside.sum() > 0.4 * outside.size  # the comparison covers a good part of the audio
    assert not constant_source.open_streams


def test_stream_has_no_jump_at_the_joins(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    pieces = _stream(t2w, speaker, _targets(), StreamSchedule(), "jumps")
    audio = np.concatenate(pieces)
    assert audio.shape == (NUM_TOKENS * SAMPLES_PER_TOKEN,)
    jumps = np.abs(np.diff(audio))
    joins = np.cumsum([len(p) for p in pieces])[:-1] - 1
    inside = np.ones_like(jumps, dtype=bool)
    inside[joins] = False
    assert jumps[joins].max() <= jumps[inside].max()
    # 15 tokens = 30 frames per chunk, the first one less the 8 withheld; the finalize call the rest.
    assert [len(p) // FRAME for p in pieces] == [22, 30, 30, 30, 2 * NUM_TOKENS - 112]


def test_finalize_and_cancel_free_the_state(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    tokens = _targets(30)
    first = t2w.stream("free", speaker, tokens[:18], finalize=False)
    assert first.shape == ((2 * 15 - 8) * FRAME,)  # 15 tokens less the 8 withheld frames
    assert t2w.open_streams == ["free"]
    tail = t2w.stream("free", speaker, tokens[15:], finalize=True)
    assert len(first) + len(tail) == 30 * SAMPLES_PER_TOKEN
    assert t2w.open_streams == []
    t2w.stream("dropped", speaker, tokens[:18], finalize=False)
    t2w.cancel("dropped")
    t2w.cancel("never-opened")
    assert t2w.open_streams == []
    assert t2w.stream("empty", speaker, [], finalize=True).shape == (0,)
    assert t2w.open_streams == []


def test_a_stream_abandoned_without_its_finalize_call_is_dropped_after_the_idle_timeout(
    t2w: DiTToken2Wav, speaker: DiTSpeaker
) -> None:
    """A cancelled request never sends its finalize call; its flow caches (0.4 GB on a full-size checkpoint)
    must not stay for ever: an H200 soak with cancelled streams filled the GPU in 10 minutes."""
    quick = DiTToken2Wav(t2w.flow, t2w.hift, stream_idle_timeout_s=0.5)
    quick.stream("abandoned", speaker, _targets(30)[:18], finalize=False)
    assert quick.open_streams == ["abandoned"]
    time.sleep(1.0)
    assert quick.open_streams == []


def test_stream_cache_stays_bounded(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    tokens = _targets(120)
    t2w.stream("long", speaker, tokens[:63], finalize=False)
    assert (
        t2w._streams.get("long").flow_cache.estimator.frames == speaker.prompt_frames + ESTIMATOR_CACHE_TAIL
    )
    t2w.cancel("long")


def test_interleaved_requests_equal_sequential_ones(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    tokens = {"a": _targets(seed=4), "b": _targets(seed=5)}
    plans = {rid: StreamSchedule().plan(NUM_TOKENS) for rid in tokens}
    sequential = {
        rid: np.concatenate(_stream(t2w, speaker, tokens[rid], StreamSchedule(), rid)) for rid in tokens
    }
    interleaved = {rid: [] for rid in tokens}
    for chunk_a, chunk_b in zip(plans["a"], plans["b"]):
        for rid, chunk in (("a", chunk_a), ("b", chunk_b)):
            piece = t2w.stream(
                rid, speaker, tokens[rid][chunk.token_offset : chunk.token_end], chunk.finalize
            )
            interleaved[rid].append(piece)
    for rid in tokens:
        np.testing.assert_array_equal(np.concatenate(interleaved[rid]), sequential[rid])


def test_threads_with_different_request_ids(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    tokens = _targets(40)
    expected = np.concatenate(_stream(t2w, speaker, tokens, StreamSchedule(), "solo"))
    results: dict[str, np.ndarray] = {}

    def run(rid: str) -> None:
        results[rid] = np.concatenate(_stream(t2w, speaker, tokens, StreamSchedule(), rid))

    threads = [threading.Thread(target=run, args=(f"thread-{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["thread-0", "thread-1", "thread-2"]
    for audio in results.values():
        np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-6)
    assert t2w.open_streams == []


def test_bad_tokens_and_short_chunks_are_refused(t2w: DiTToken2Wav, speaker: DiTSpeaker) -> None:
    with pytest.raises(ValueError, match="6561"):
        t2w.offline([5, 6561], speaker)
    with pytest.raises(ValueError, match="-1"):
        t2w.stream("bad", speaker, [1, 2, 3, -1, 5], finalize=False)
    with pytest.raises(ValueError, match="more than 3 tokens"):
        t2w.stream("short", speaker, [1, 2, 3], finalize=False)
    with pytest.raises(ValueError, match="withheld"):
        t2w.stream("short", speaker, [1, 2, 3, 4, 5, 6], finalize=False)
    assert t2w.open_streams == []


def test_from_model_dir_checks_device_and_dtype(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype"):
        DiTToken2Wav.from_model_dir(tmp_path, device="cpu", dtype="float64")
    with pytest.raises(ValueError, match="device"):
        DiTToken2Wav.from_model_dir(tmp_path, device="tpu")
