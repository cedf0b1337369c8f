"""The bucketed flow decoder (`GraphedCFM`) on CPU: padding and batching leave every valid frame as the eager
decoder makes it, and calls that fit no graph run eagerly. The CUDA graphs themselves (capture, replay, graphed
against eager in fp16) are checked on a GPU by `scripts/bench_flow_graphs.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.cosyvoice2.flow.graphs import FlowGraphConfig, GraphedCFM
from tritontts.synthetic.cosyvoice2_flow import write_flow

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 10
# Padding changes only the shapes the kernels see (their summation order): measured 1.3e-6 at most.
PADDED_BOUND = 1e-5


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    directory = tmp_path_factory.mktemp("cosyvoice2_tiny")
    write_flow(directory, "tiny", seed=0)
    return load_flow(directory)


def _inputs(frames: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    mu = torch.randn(1, 80, frames, generator=gen)
    cond = torch.zeros(1, 80, frames)
    cond[:, :, : frames // 3] = torch.randn(1, 80, frames // 3, generator=gen)
    spks = torch.randn(1, 80, generator=gen)
    return mu, torch.ones(1, 1, frames), spks, cond


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("frames", [37, 64, 101])
def test_padded_equals_unpadded_on_the_valid_frames(flow: Flow, frames: int, streaming: bool) -> None:
    graphed = GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(64, 128)))
    inputs = _inputs(frames, seed=frames)
    with torch.inference_mode():
        expected = flow.decoder(*inputs, STEPS, streaming)
        padded = graphed(*inputs, STEPS, streaming)
    assert padded.shape == expected.shape == (1, 80, frames)
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 0}
    assert (padded - expected).abs().max() < PADDED_BOUND


@pytest.mark.parametrize("streaming", [False, True])
def test_streams_batched_in_one_call_equal_each_alone(flow: Flow, streaming: bool) -> None:
    graphed = GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(128,), batch_sizes=(1, 3)))
    lengths = (37, 100, 64)
    rows = [_inputs(n, seed=n) for n in lengths]
    batch = [torch.zeros(3, *shape) for shape in ((80, 128), (1, 128), (80,), (80, 128))]
    for i, (mu, mask, spks, cond) in enumerate(rows):
        n = mu.size(2)
        batch[0][i, :, :n], batch[1][i, :, :n], batch[2][i], batch[3][i, :, :n] = (
            mu[0],
            mask[0],
            spks[0],
            cond[0],
        )
    with torch.inference_mode():
        together = graphed(*batch, STEPS, streaming)
        alone = [flow.decoder(*row, STEPS, streaming) for row in rows]
    for i, expected in enumerate(alone):
        assert (together[i : i + 1, :, : lengths[i]] - expected).abs().max() < PADDED_BOUND


def test_calls_that_fit_no_graph_run_eagerly(flow: Flow) -> None:
    graphed = GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(64,), batch_sizes=(1,)))
    with torch.inference_mode():
        long = graphed(*_inputs(65, seed=1), STEPS)
        assert graphed.calls["eager"] == 1
        torch.testing.assert_close(long, flow.decoder(*_inputs(65, seed=1), STEPS), rtol=0, atol=0)
        graphed(*(torch.cat([t, t]) for t in _inputs(20, seed=2)), STEPS)  # batch 2: no graph of that size
        graphed(*_inputs(20, seed=3), 5)  # other step counts
        assert graphed.calls == {"graph": 0, "padded": 0, "eager": 3}
        graphed(*_inputs(64, seed=4), STEPS)
    assert graphed.calls == {"graph": 0, "padded": 1, "eager": 3}


def test_bucket_choice_and_config_errors() -> None:
    config = FlowGraphConfig(buckets=(64, 128))
    assert [config.bucket(n) for n in (1, 64, 65, 128, 129)] == [64, 64, 128, 128, None]
    for bad in ((), (128, 64), (0, 64), (64, 64)):
        with pytest.raises(ValueError, match="buckets"):
            FlowGraphConfig(buckets=bad)
    with pytest.raises(ValueError, match="batch_sizes"):
        FlowGraphConfig(batch_sizes=(0,))


def test_capture_needs_a_cuda_model(flow: Flow) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        GraphedCFM(flow.decoder, STEPS).capture()


def test_flow_inference_through_the_bucketed_decoder(flow: Flow, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(7)
    args = {
        "token": torch.randint(0, 6561, (1, 30), generator=gen, dtype=torch.int32),
        "token_len": torch.tensor([30]),
        "prompt_token": torch.randint(0, 6561, (1, 12), generator=gen, dtype=torch.int32),
        "prompt_token_len": torch.tensor([12]),
        "prompt_feat": torch.randn(1, 24, 80, generator=gen),
        "prompt_feat_len": torch.tensor([24]),
        "embedding": torch.randn(1, 192, generator=gen),
    }
    expected = flow.inference(**args, streaming=True, finalize=False)
    flow.graphed_decoder = GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(128,)))
    try:
        got = flow.inference(**args, streaming=True, finalize=False)
    finally:
        graphed, flow.graphed_decoder = flow.graphed_decoder, None
    assert graphed.calls["padded"] == 1
    assert (got - expected).abs().max() < PADDED_BOUND
