"""The bucketed flow decoder (`GraphedCFM`) on CPU: padding and batching leave every valid frame as the eager
decoder makes it, and calls that fit no graph run eagerly. The CUDA graphs themselves (capture, replay, graphed
against eager in fp16) are checked on a GPU by `scripts/bench_flow_graphs.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hift_models import constant_source_hift

from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.cosyvoice2.flow import graphs as graphs_module
from tritontts.cosyvoice2.flow.graphs import WARM_UP_STEPS, GraphedCFM
from tritontts.cosyvoice2.token2wav import StreamSchedule, Token2Wav, Token2WavCall
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig, flow_graph_config
from tritontts.synthetic.cosyvoice2_flow import write_flow

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 10
# Padding changes only the shapes the kernels see (their summation order): measured 1.3e-6 at most.
PADDED_BOUND = 1e-5
# Those differences in the audio of a constant-source HiFT: measured 6.2e-7 at most (AVX-512 and ATen default).
BATCHED_AUDIO_BOUND = 5e-6


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


def test_each_capture_warms_up_with_two_steps_and_captures_every_step(
    flow: Flow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The eager run before a capture (lazy kernels, workspaces) launches each kernel of the loop once at the
    graph's shapes: 2 Euler steps, not all of them. Capture itself needs CUDA: here its two calls are counted."""
    steps: list[int] = []
    phases: list[tuple[str, int]] = []

    def capture(run, device, pool, warm_up=None):
        for name, call in (("warm-up", warm_up), ("captured run", run)):
            steps.clear()
            out = call()
            phases.append((name, len(steps)))
        return None, out

    def within_limit(keys, capture_key, device, memory_limit_mib, what):
        for key in keys:
            capture_key(key, None)
        return CaptureReport(len(keys), 0.0, 0.0)

    monkeypatch.setattr(graphs_module, "capture_graph", capture)
    monkeypatch.setattr(graphs_module, "capture_within_limit", within_limit)
    hook = flow.decoder.estimator.register_forward_pre_hook(lambda module, args: steps.append(1))
    try:
        with torch.inference_mode():
            GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(64,))).capture()
    finally:
        hook.remove()
    assert phases == [("warm-up", WARM_UP_STEPS), ("captured run", STEPS)] * 2  # without and with streaming


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


@pytest.fixture(scope="module")
def token2wav(flow: Flow) -> Token2Wav:
    """The tiny flow and a constant-source HiFT: a mel difference reaches the audio as it is."""
    return Token2Wav(flow, constant_source_hift())


def _speaker(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6561, (1, 10 + seed), generator=gen, dtype=torch.int32)
    return (
        tokens,
        0.3 * torch.randn(1, 2 * tokens.shape[1], 80, generator=gen),
        torch.randn(1, 192, generator=gen),
    )


def test_streams_batched_through_token2wav_equal_each_alone(token2wav: Token2Wav) -> None:
    """Three streams of different voices and lengths and one offline call share each round's flow decoder
    call (`run_many`); every stream's audio equals the stream run alone, call by call."""
    schedule = StreamSchedule(exponential=True)
    targets = [
        torch.randint(0, 6561, (1, n), generator=torch.Generator().manual_seed(n)) for n in (40, 60, 75)
    ]
    speakers = [_speaker(i) for i in range(3)]
    plans = [schedule.plan(t.shape[1]) for t in targets]
    alone = [
        [
            token2wav.stream(
                f"alone{i}", targets[i][:, : c.token_end], *speakers[i], c.token_offset, c.finalize
            )
            for c in plan
        ]
        for i, plan in enumerate(plans)
    ]
    offline_alone = token2wav.offline(targets[0], *speakers[1])

    token2wav.flow.graphed_decoder = GraphedCFM(
        token2wav.flow.decoder, STEPS, FlowGraphConfig(buckets=(128, 256), batch_sizes=(1, 2, 4))
    )
    try:
        together: list[list[torch.Tensor]] = [[] for _ in plans]
        for round_index in range(max(len(p) for p in plans)):
            calls = [
                Token2WavCall(
                    targets[i][:, : plan[round_index].token_end],
                    *speakers[i],
                    f"s{i}",
                    plan[round_index].token_offset,
                    plan[round_index].finalize,
                )
                for i, plan in enumerate(plans)
                if round_index < len(plan)
            ]
            calls.append(Token2WavCall(targets[0], *speakers[1]))
            results = token2wav.run_many(calls)
            assert all(isinstance(r, torch.Tensor) for r in results)
            for call, audio in zip(calls[:-1], results):
                together[int(call.stream_id[1:])].append(audio)
            assert (results[-1] - offline_alone).abs().max() < BATCHED_AUDIO_BOUND
        calls_made = token2wav.flow.graphed_decoder.calls
    finally:
        token2wav.flow.graphed_decoder = None
    assert calls_made["padded"] > calls_made["eager"] == 0
    for ours, expected in zip(together, alone):
        assert [a.shape for a in ours] == [a.shape for a in expected]
        for a, b in zip(ours, expected):
            assert (a - b).abs().max() < BATCHED_AUDIO_BOUND
    assert token2wav.open_streams == []


def test_run_many_isolates_a_bad_call_and_orders_a_streams_calls(token2wav: Token2Wav) -> None:
    speaker = _speaker(0)
    tokens = torch.randint(0, 6561, (1, 40), generator=torch.Generator().manual_seed(3))
    expected_first = token2wav.stream("x", tokens[:, :18], *speaker, 0, False)
    expected_last = token2wav.stream("x", tokens, *speaker, 15, True)
    results = token2wav.run_many(
        [
            Token2WavCall(tokens[:, :18], *speaker, "y", 0, False),
            Token2WavCall(tokens[:, :2], *speaker, "bad", 0, False),  # fewer tokens than the look-ahead
            Token2WavCall(tokens, *speaker, "y", 15, True),  # the same stream: runs after the first
        ]
    )
    assert isinstance(results[1], ValueError) and "leaves no frame for the target" in str(results[1])
    torch.testing.assert_close(results[0], expected_first, rtol=0, atol=0)
    torch.testing.assert_close(results[2], expected_last, rtol=0, atol=0)
    assert token2wav.open_streams == []


def test_deployment_parameters() -> None:
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert flow_graph_config("auto", "1,2,4", cpu) is None
    assert flow_graph_config("false", "1", gpu) is None
    assert flow_graph_config("auto", "4,1,2,2", gpu).batch_sizes == (1, 2, 4)
    assert flow_graph_config("true", "8", gpu).batch_sizes == (8,)
    with pytest.raises(ValueError, match="cuda_graphs must be auto, true or false"):
        flow_graph_config("on", "1", gpu)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        flow_graph_config("true", "1", cpu)
    with pytest.raises(ValueError, match="cuda_graph_batch_sizes"):
        flow_graph_config("true", "1;2", gpu)


def test_stream_calls_parameter() -> None:
    """An offline deployment (stream_calls false) captures only the graphs of whole-utterance calls."""
    gpu = torch.device("cuda")
    assert flow_graph_config("auto", "1", gpu).streaming == (False, True)
    assert flow_graph_config("auto", "1", gpu, "false", "true").streaming == (False, True)
    assert flow_graph_config("auto", "1", gpu, "false", "false").streaming == (False,)
    with pytest.raises(ValueError, match="stream_calls must be true or false, got 'offline'"):
        flow_graph_config("auto", "1", gpu, "false", "offline")


def test_flow_compile_parameter() -> None:
    gpu = torch.device("cuda")
    assert flow_graph_config("auto", "1", gpu).compile is False
    assert flow_graph_config("auto", "1", gpu, "true").compile is True
    assert flow_graph_config("auto", "1", gpu, "auto").compile is True
    assert (
        flow_graph_config("auto", "1", torch.device("cpu"), "auto") is None
    )  # no graphs, nothing to compile
    with pytest.raises(ValueError, match="flow_compile true needs the flow's CUDA graphs"):
        flow_graph_config("false", "1", gpu, "true")
    with pytest.raises(ValueError, match="flow_compile must be auto, true or false"):
        flow_graph_config("auto", "1", gpu, "yes")


def test_graphs_capture_the_compiled_estimator_and_eager_calls_keep_the_plain_one(flow: Flow) -> None:
    graphed = GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(64,), compile=True))
    assert isinstance(graphed.captured_estimator, torch._dynamo.eval_frame.OptimizedModule)
    assert graphed.captured_estimator._orig_mod is flow.decoder.estimator
    assert GraphedCFM(flow.decoder, STEPS, FlowGraphConfig(buckets=(64,))).captured_estimator is None
    seen = []

    def counting(*args):
        seen.append(args[0].shape)
        return flow.decoder.estimator(*args)

    mu, mask, spks, cond = _inputs(40, seed=1)
    with torch.inference_mode():
        guided = flow.decoder.guided_inputs(mu, mask, spks, cond)
        x = flow.decoder.start(1, 40, mu.dtype)
        through = flow.decoder.solve(x, *guided, STEPS, True, counting)
        plain = flow.decoder.solve(x, *guided, STEPS, True)
    assert len(seen) == STEPS and seen[0] == (2, 80, 40)
    torch.testing.assert_close(through, plain, rtol=0, atol=0)
