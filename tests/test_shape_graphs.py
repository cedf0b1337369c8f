"""The per-shape graph cache's policy (capture on the n-th sighting, options in the key, least recently used
dropped, outputs not aliased to the graph's buffers) with a capture that replays the function on CPU, and the
capturable inverse STFT against torch.istft. The CUDA replay itself is compared with eager in
scripts/bench_flow_graphs.py on the GPU."""

from __future__ import annotations

import pytest
import torch

from tritontts.dsp.istft import istft
from tritontts.shape_graphs import ShapeGraphConfig, ShapeGraphs


class ReplayOnCPU:
    """Stands in for a torch.cuda.CUDAGraph: replay runs the captured function again on its static inputs."""

    def __init__(self, run):
        self.run, self.out = run, None

    def replay(self):
        for static, value in zip(self.out, self.run()):
            static.copy_(value)


def cpu_capture(run, device, pool):
    graph = ReplayOnCPU(run)
    graph.out = run()
    return graph, graph.out


def make(fn, **config):
    return ShapeGraphs(fn, torch.device("cpu"), ShapeGraphConfig(**config), capture=cpu_capture)


def test_a_shape_is_captured_on_its_second_call_and_replayed_after():
    calls = []

    def fn(x):
        calls.append(x.shape)
        return x * 2

    graphs = make(fn, min_uses=2)
    x = torch.arange(4.0)
    assert torch.equal(graphs(x), x * 2)
    assert (graphs.eager_calls, graphs.captured) == (1, 0)
    assert torch.equal(graphs(x + 1), (x + 1) * 2)
    assert graphs.captured == 1 and graphs.replays == 1
    assert torch.equal(graphs(x + 5), (x + 5) * 2)
    assert graphs.replays == 2
    assert torch.equal(graphs(torch.ones(3)), torch.full((3,), 2.0))
    assert graphs.eager_calls == 2


def test_outputs_are_copies_and_tuples_stay_tuples():
    graphs = make(lambda a, b: (a + b, a - b), min_uses=1)
    first = graphs(torch.ones(2), torch.ones(2))
    second = graphs(torch.full((2,), 3.0), torch.ones(2))
    assert isinstance(first, tuple) and len(first) == 2
    assert torch.equal(first[0], torch.full((2,), 2.0)), "an earlier result changed with the next replay"
    assert torch.equal(second[0], torch.full((2,), 4.0)) and torch.equal(second[1], torch.full((2,), 2.0))


def test_options_and_dtypes_are_part_of_the_key():
    graphs = make(lambda x, scale=1: x * scale, min_uses=1)
    x = torch.ones(2)
    assert torch.equal(graphs(x, scale=3), torch.full((2,), 3.0))
    assert torch.equal(graphs(x, scale=5), torch.full((2,), 5.0))
    assert torch.equal(graphs(x.double(), scale=5), torch.full((2,), 5.0, dtype=torch.float64))
    assert graphs.captured == 3


def test_the_least_recently_used_graph_is_dropped_past_max_graphs():
    graphs = make(lambda x: x + 1, min_uses=2, max_graphs=2)
    a, b, c = torch.zeros(1), torch.zeros(2), torch.zeros(3)
    for x in (a, a, b, b, a, c, c):
        graphs(x)
    assert graphs.captured == 2
    replays, eager = graphs.replays, graphs.eager_calls
    graphs(a)
    assert graphs.replays == replays + 1, "the recently used shape was kept"
    graphs(b)
    assert graphs.eager_calls == eager + 1, "the least recently used shape was dropped and is seen anew"


def test_a_call_that_cannot_be_captured_stays_eager():
    def refuse(run, device, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = ShapeGraphs(lambda x: x * 3, torch.device("cpu"), ShapeGraphConfig(min_uses=1), capture=refuse)
    for _ in range(3):
        assert torch.equal(graphs(torch.ones(2)), torch.full((2,), 3.0))
    assert (graphs.captured, graphs.eager_calls) == (0, 3)


def test_no_new_shape_is_captured_once_captures_reserved_the_limit():
    graphs = make(lambda x: x + 1, min_uses=1, memory_limit_mib=1)
    # each reading is 1 MiB above the last: a capture reserves 1 MiB
    reserved = iter(range(0, 100 * 2**20, 2**20))
    graphs._reserved = lambda: next(reserved)
    graphs(torch.zeros(1))
    graphs(torch.zeros(2))
    assert graphs.captured == 2 and graphs.captured_bytes == 2 * 2**20
    graphs(torch.zeros(3))
    assert graphs.captured == 2 and graphs.eager_calls == 1
    graphs(torch.zeros(1))
    assert graphs.replays == 3, "graphs already captured still replay"


def test_cuda_capture_needs_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA"):
        ShapeGraphs(lambda x: x, torch.device("cpu"))


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="positive"):
        ShapeGraphConfig(min_uses=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("frames", [2, 7, 186])
def test_istft_equals_torch_istft(dtype, frames):
    gen = torch.Generator().manual_seed(frames)
    window = torch.hann_window(16, periodic=True, dtype=dtype)
    spectrum = torch.complex(
        torch.randn(2, 9, frames, generator=gen, dtype=dtype),
        torch.randn(2, 9, frames, generator=gen, dtype=dtype),
    )
    expected = torch.istft(spectrum, 16, 4, 16, window)
    got = istft(spectrum, 16, 4, window)
    assert got.shape == expected.shape
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    assert torch.allclose(got, expected, atol=tolerance, rtol=0)
