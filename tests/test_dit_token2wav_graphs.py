"""The bucketed DiT flow decoder (`GraphedDiTCFM`) on CPU: padding a chunk's frames and its cache's key frames,
or an offline call's frames, and batching streams leave every valid frame of the mel and of the returned caches
as the eager decoder makes them; calls that fit no bucket run eagerly. The CUDA graphs themselves (capture,
replay, graphed against eager in fp16) are checked on a GPU by `scripts/bench_dit_flow_graphs.py`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.dit_token2wav import DiTToken2Wav
from tritontts.dit_token2wav.cfm import EstimatorCache
from tritontts.dit_token2wav.flow import DiTFlow, FlowChunk, load_dit_flow
from tritontts.dit_token2wav.graphs import DiTFlowGraphConfig, FlowRow, GraphedDiTCFM
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 10
# Padding changes only the shapes the kernels see (their summation order): measured 2.1e-6 at most (1 and 2
# threads).
PADDED_BOUND = 1e-5
CONFIG = DiTFlowGraphConfig(buckets=(64, 128), chunk_buckets=(16, 64), cache_buckets=(64, 256))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dit_token2wav(tmp_path_factory.mktemp("dit_tiny"), "tiny", seed=0)


@pytest.fixture(scope="module")
def flow(model_dir: Path) -> DiTFlow:
    return load_dit_flow(model_dir)


def _inputs(frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mu, spks, cond of one call; cond holds a prompt over the first third."""
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(1, 80, frames, generator=gen)
    cond = torch.zeros(1, 80, frames)
    cond[:, :, : frames // 3] = torch.randn(1, 80, frames // 3, generator=gen)
    return mu, torch.randn(1, 80, generator=gen), cond


def _cache(flow: DiTFlow, frames: int, seed: int) -> EstimatorCache | None:
    """The estimator cache after an eager chunk of `frames` frames (None for 0)."""
    if frames == 0:
        return None
    with torch.inference_mode():
        _, cache = flow.decoder.forward_chunk(*_inputs(frames, seed), STEPS)
    return cache


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


def _assert_chunk_close(got: tuple, expected: tuple, given: EstimatorCache | None, frames: int) -> None:
    (mel, cache), (expected_mel, expected_cache) = got, expected
    assert _max_diff(mel, expected_mel) < PADDED_BOUND
    assert _max_diff(cache.cnn, expected_cache.cnn) < PADDED_BOUND
    assert _max_diff(cache.att, expected_cache.att) < PADDED_BOUND
    if given is not None:  # the cached keys follow the chunk's own ones as they were given
        torch.testing.assert_close(cache.att[:, :, :, :, frames:], given.att, rtol=0, atol=0)


@pytest.mark.parametrize("cache_frames", [0, 37, 150])
@pytest.mark.parametrize("frames", [1, 2, 17, 50])
def test_padded_chunk_equals_unpadded_on_the_valid_frames(
    flow: DiTFlow, cache_frames: int, frames: int
) -> None:
    graphed = GraphedDiTCFM(flow.decoder, STEPS, CONFIG)
    cache = _cache(flow, cache_frames, seed=cache_frames)
    inputs = _inputs(frames, seed=frames)
    with torch.inference_mode():
        expected = flow.decoder.forward_chunk(*inputs, STEPS, cache)
        got = graphed.forward_chunk(*inputs, STEPS, cache)
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 0}
    assert got[0].shape == (1, 80, frames)
    assert got[1].frames == cache_frames + frames
    _assert_chunk_close(got, expected, cache, frames)


@pytest.mark.parametrize("frames", [5, 64, 100])
def test_padded_offline_equals_unpadded_on_the_valid_frames(flow: DiTFlow, frames: int) -> None:
    graphed = GraphedDiTCFM(flow.decoder, STEPS, CONFIG)
    inputs = _inputs(frames, seed=frames)
    noise = torch.randn(1, 80, frames, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        for start in (None, noise):
            got = graphed(*inputs, STEPS, start)
            assert got.shape == (1, 80, frames)
            assert _max_diff(got, flow.decoder(*inputs, STEPS, start)) < PADDED_BOUND
    assert graphed.calls == {"graph": 0, "padded": 2, "eager": 0}


def test_streams_batched_in_one_call_equal_each_alone(flow: DiTFlow) -> None:
    """Three streams of different chunk and cache lengths share one call of batch 4 (one row of zeros)."""
    graphed = GraphedDiTCFM(flow.decoder, STEPS, replace(CONFIG, batch_sizes=(1, 4)))
    shapes = [(50, 150), (17, 0), (40, 90)]
    rows = [FlowRow(*_inputs(t, seed=t), _cache(flow, c, seed=c)) for t, c in shapes]
    with torch.inference_mode():
        together = graphed.run(rows, STEPS, streaming=True)
        alone = [flow.decoder.forward_chunk(r.mu, r.spks, r.cond, STEPS, r.cache) for r in rows]
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 0}
    for row, got, expected in zip(rows, together, alone):
        _assert_chunk_close(got, expected, row.cache, row.frames)


def test_offline_calls_batched_in_one_call_equal_each_alone(flow: DiTFlow) -> None:
    graphed = GraphedDiTCFM(flow.decoder, STEPS, replace(CONFIG, batch_sizes=(2,)))
    rows = [FlowRow(*_inputs(t, seed=t)) for t in (100, 33)]
    with torch.inference_mode():
        together = graphed.run(rows, STEPS, streaming=False)
        for row, (mel, cache) in zip(rows, together):
            assert cache is None
            assert _max_diff(mel, flow.decoder(row.mu, row.spks, row.cond, STEPS)) < PADDED_BOUND
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 0}


def test_a_stream_through_the_padded_decoder_follows_the_eager_one(flow: DiTFlow) -> None:
    """Prompt, then chunks whose caches are cut as DiTToken2Wav.stream does (prompt frames + the last 100, in
    the padded decoder's copy): every chunk's mel and the last cache as the eager flow trimmed after it."""
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 6561, (1, 30), generator=gen)
    prompt_mel = torch.randn(1, 60, 80, generator=gen)
    embedding = torch.randn(1, 192, generator=gen)
    target = torch.randint(0, 6561, (1, 90), generator=gen)
    chunks = [(0, 28, False), (25, 53, False), (50, 78, False), (75, 90, True)]

    def stream(windowed: bool) -> tuple[list[torch.Tensor], EstimatorCache]:
        """windowed: the caches cut in the flow's copy (FlowChunk.keep), else by `trimmed` after it."""
        cache = flow.setup_cache(torch.cat([prompt, prompt[:, :3]], dim=1), prompt_mel, embedding)
        mels = []
        for start, end, last in chunks:
            tokens = target[:, start:end]
            if windowed:
                [(mel, cache)] = flow.inference_chunks([FlowChunk(tokens, embedding, cache, last, (60, 100))])
            else:
                mel, cache = flow.inference_chunk(tokens, embedding, cache, last)
                cache = cache.trimmed(60, 100)
            mels.append(mel)
        return mels, cache.estimator

    expected_mels, expected_cache = stream(windowed=False)
    flow.graphed_decoder = GraphedDiTCFM(flow.decoder, STEPS, CONFIG)
    try:
        mels, cache = stream(windowed=True)
        calls = flow.graphed_decoder.calls
    finally:
        flow.graphed_decoder = None
    assert calls == {"graph": 0, "padded": 5, "eager": 0}  # the prompt's 60 frames fit the 64 bucket
    for got, expected in zip(mels, expected_mels):
        assert _max_diff(got, expected) < PADDED_BOUND
    assert cache.frames == 160
    assert _max_diff(cache.cnn, expected_cache.cnn) < PADDED_BOUND
    assert _max_diff(cache.att, expected_cache.att) < PADDED_BOUND


def test_calls_that_fit_no_bucket_run_eagerly(flow: DiTFlow) -> None:
    graphed = GraphedDiTCFM(flow.decoder, STEPS, CONFIG)
    small_cache = _cache(flow, 20, seed=1)
    with torch.inference_mode():
        for inputs, cache in (
            (_inputs(65, seed=2), small_cache),  # more chunk frames than the largest chunk bucket
            (
                _inputs(10, seed=3),
                _cache(flow, 257, seed=3),
            ),  # more cache frames than the largest cache bucket
        ):
            got, expected = (d.forward_chunk(*inputs, STEPS, cache) for d in (graphed, flow.decoder))
            torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
            torch.testing.assert_close(got[1].att, expected[1].att, rtol=0, atol=0)
        long = _inputs(129, seed=4)  # more frames than the largest offline bucket
        torch.testing.assert_close(graphed(*long, STEPS), flow.decoder(*long, STEPS), rtol=0, atol=0)
        graphed(*_inputs(20, seed=5), 5)  # another step count
        assert graphed.calls == {"graph": 0, "padded": 0, "eager": 4}
        graphed.forward_chunk(*_inputs(20, seed=6), STEPS, small_cache)
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 4}


def test_only_the_configured_modes_are_bucketed(flow: DiTFlow) -> None:
    graphed = GraphedDiTCFM(flow.decoder, STEPS, replace(CONFIG, streaming=(True,)))
    with torch.inference_mode():
        graphed(*_inputs(20, seed=1), STEPS)
        graphed.forward_chunk(*_inputs(20, seed=1), STEPS)
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 1}


def test_config_buckets_and_errors() -> None:
    plain = FlowGraphConfig(buckets=(256,), batch_sizes=(1, 2), streaming=(True,), memory_limit_mib=100)
    config = DiTFlowGraphConfig.of(plain)
    assert config == DiTFlowGraphConfig(
        buckets=(256,), batch_sizes=(1, 2), streaming=(True,), memory_limit_mib=100
    )
    assert config.chunk_buckets == (64, 128, 256) and config.cache_buckets[0] == 128
    assert DiTFlowGraphConfig.of(None) == DiTFlowGraphConfig()
    assert DiTFlowGraphConfig.of(CONFIG) is CONFIG
    for field in ("chunk_buckets", "cache_buckets"):
        for bad in ((), (128, 64), (0, 64)):
            with pytest.raises(ValueError, match=field):
                DiTFlowGraphConfig(**{field: bad})
    with pytest.raises(ValueError, match="batch_sizes"):
        DiTFlowGraphConfig(batch_sizes=(0,))


def test_capture_needs_a_cuda_model(flow: DiTFlow, model_dir: Path) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        GraphedDiTCFM(flow.decoder, STEPS).capture()
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        DiTToken2Wav.from_model_dir(model_dir, device="cpu", flow_graphs=FlowGraphConfig())
    assert flow.graphed_decoder is None
