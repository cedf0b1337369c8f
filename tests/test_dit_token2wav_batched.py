"""Streams of the DiT token2wav decoded together (`DiTToken2Wav.stream_many`): each stream's audio as when it
runs alone, whether the flow runs its plain decoder row by row or one padded, batched decoder call per round
(`GraphedDiTCFM` with batch sizes above 1, as `cuda_graph_batch_sizes` captures it on a GPU; on the CPU the
same padded call runs without a graph). A refused call fails alone, and two calls of one stream in one batch
run one after the other."""

from __future__ import annotations

import numpy as np
import pytest
from hift_models import constant_source_hift

from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.dit_token2wav import DiTSpeaker, DiTToken2Wav
from tritontts.dit_token2wav.graphs import DiTFlowGraphConfig, GraphedDiTCFM
from tritontts.dit_token2wav.token2wav import DiTStreamCall
from tritontts.synthetic.cosyvoice2 import voiced_signal
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LENGTHS = (70, 40, 95)
BATCHED = DiTFlowGraphConfig(
    buckets=(64,), batch_sizes=(1, 2, 4), chunk_buckets=(64,), cache_buckets=(128, 256), streaming=(True,)
)
# Padding and batching change only the shapes the kernels see: the mel within 2.1e-6 (test_dit_token2wav_graphs),
# the audio of a constant-source HiFT measured within 5.5e-7.
BATCHED_AUDIO_BOUND = 5e-6


@pytest.fixture(scope="module")
def t2w(tmp_path_factory: pytest.TempPathFactory) -> DiTToken2Wav:
    folder = write_dit_token2wav(tmp_path_factory.mktemp("dit_tiny"), "tiny", seed=0)
    return DiTToken2Wav.from_model_dir(folder, device="cpu")


@pytest.fixture(scope="module")
def constant_source(t2w: DiTToken2Wav) -> DiTToken2Wav:
    """The same flow with a constant-source HiFT: the audio follows the mel, not an f0 estimate's phase."""
    return DiTToken2Wav(t2w.flow, constant_source_hift())


@pytest.fixture(scope="module")
def speakers(t2w: DiTToken2Wav) -> list[DiTSpeaker]:
    return [t2w.prepare_speaker(voiced_signal(seconds=s, seed=i)) for i, s in enumerate((2.0, 1.5))]


def plans(speakers: list[DiTSpeaker]) -> dict[str, list[DiTStreamCall]]:
    """Each stream's calls, upstream's schedule: its own targets, the speakers taken in turn."""
    streams = {}
    for index, length in enumerate(LENGTHS):
        tokens = np.random.default_rng(index).integers(0, 6561, length).astype(np.int32)
        rid, speaker = f"s{index}", speakers[index % len(speakers)]
        streams[rid] = [
            DiTStreamCall(rid, speaker, tokens[c.token_offset : c.token_end], c.finalize)
            for c in StreamSchedule().plan(length)
        ]
    return streams


def alone(t2w: DiTToken2Wav, streams: dict[str, list[DiTStreamCall]]) -> dict[str, np.ndarray]:
    return {
        rid: np.concatenate([t2w.stream(c.request_id, c.speaker, c.tokens, c.finalize) for c in calls])
        for rid, calls in streams.items()
    }


def together(t2w: DiTToken2Wav, streams: dict[str, list[DiTStreamCall]]) -> dict[str, np.ndarray]:
    """Round k passes every stream's call k in one stream_many; stream s1's first two calls share a batch."""
    pieces: dict[str, list[np.ndarray]] = {rid: [] for rid in streams}
    queues = {rid: list(calls) for rid, calls in streams.items()}
    queues["s1"] = [queues["s1"][:2], *([c] for c in queues["s1"][2:])]
    queues = {rid: [c if isinstance(c, list) else [c] for c in q] for rid, q in queues.items()}
    while any(queues.values()):
        batch = [call for queue in queues.values() if queue for call in queue.pop(0)]
        for call, audio in zip(batch, t2w.stream_many(batch)):
            assert not isinstance(audio, Exception), audio
            pieces[call.request_id].append(audio)
    return {rid: np.concatenate(p) for rid, p in pieces.items()}


def test_plain_decoder_streams_together_give_each_streams_audio(t2w, speakers) -> None:
    streams = plans(speakers)
    expected = alone(t2w, streams)
    got = together(t2w, streams)
    for rid in streams:
        np.testing.assert_array_equal(got[rid], expected[rid])
    assert t2w.open_streams == []


def test_batched_decoder_calls_give_each_streams_audio(constant_source, speakers) -> None:
    t2w = constant_source
    streams = plans(speakers)
    expected = alone(t2w, streams)
    t2w.flow.graphed_decoder = GraphedDiTCFM(t2w.flow.decoder, t2w.flow.config.n_timesteps, BATCHED)
    try:
        got = together(t2w, streams)
        calls = dict(t2w.flow.graphed_decoder.calls)
    finally:
        t2w.flow.graphed_decoder = None
    chunks = sum(len(c) for c in streams.values())
    assert calls["eager"] == 0 and calls["padded"] < chunks, calls
    for rid in streams:
        assert got[rid].shape == expected[rid].shape
        error = float(np.abs(got[rid] - expected[rid]).max())
        print(f"{rid}: batched against alone, max |difference| {error:.2e}")
        assert error < BATCHED_AUDIO_BOUND


def test_a_refused_call_fails_alone(t2w, speakers) -> None:
    good = plans(speakers)["s0"][0]
    bad = DiTStreamCall("bad", speakers[0], np.array([1, 2, 7000, 4, 5], dtype=np.int32), False)
    short = DiTStreamCall("short", speakers[0], np.array([1, 2, 3], dtype=np.int32), False)
    results = t2w.stream_many([bad, good, short])
    assert isinstance(results[0], ValueError) and "7000" in str(results[0])
    assert isinstance(results[2], ValueError) and "more than 3 tokens" in str(results[2])
    assert isinstance(results[1], np.ndarray) and results[1].size > 0
    t2w.cancel(good.request_id)
    assert t2w.open_streams == []


def test_a_stream_that_fails_after_the_flow_fails_alone_and_is_dropped(t2w, speakers, monkeypatch) -> None:
    calls = [plans(speakers)[rid][0] for rid in ("s0", "s1")]
    real = t2w._continue

    def failing(call, state, flowed):
        if call.request_id == "s1":
            raise RuntimeError("vocoder failed")
        return real(call, state, flowed)

    monkeypatch.setattr(t2w, "_continue", failing)
    results = t2w.stream_many(calls)
    assert isinstance(results[1], RuntimeError)
    assert isinstance(results[0], np.ndarray) and results[0].size > 0
    assert t2w.open_streams == ["s0"]
    t2w.cancel("s0")


OFFLINE = DiTFlowGraphConfig(buckets=(256,), batch_sizes=(1, 2, 4), streaming=(False,))


@pytest.mark.parametrize("padded", [False, True], ids=["plain", "batched"])
def test_whole_utterances_together_give_each_ones_audio(constant_source, speakers, padded) -> None:
    t2w = constant_source
    utterances = [
        (np.random.default_rng(20 + i).integers(0, 6561, n).astype(np.int32), speakers[i % 2])
        for i, n in enumerate((20, 35, 28))
    ]
    expected = [t2w.offline(tokens, speaker) for tokens, speaker in utterances]
    bad = (np.array([1, 7000], dtype=np.int32), speakers[0])
    empty = (np.zeros(0, dtype=np.int32), speakers[1])
    if padded:
        t2w.flow.graphed_decoder = GraphedDiTCFM(t2w.flow.decoder, t2w.flow.config.n_timesteps, OFFLINE)
    try:
        got = t2w.offline_many([utterances[0], bad, utterances[1], empty, utterances[2]])
        calls = None if not padded else dict(t2w.flow.graphed_decoder.calls)
    finally:
        t2w.flow.graphed_decoder = None
    assert isinstance(got[1], ValueError) and "7000" in str(got[1])
    assert got[3].shape == (0,)
    if padded:
        assert calls == {"graph": 0, "padded": 1, "eager": 0}, calls  # three utterances in one padded call
    for audio, alone in zip((got[0], got[2], got[4]), expected):
        assert audio.shape == alone.shape
        assert float(np.abs(audio - alone).max()) < BATCHED_AUDIO_BOUND
