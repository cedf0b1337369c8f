"""The flow encoder padded to token buckets (`encoder_graphs.py`) on CPU: padding leaves every valid frame as the
plain encoder makes it (CosyVoice2's conformer and CosyVoice3's pre-lookahead layer, with and without look-ahead,
streaming masks or not), the bucketed runner gives `Flow.conditions` the eager mu, and calls past the largest
bucket run the plain encoder. The CUDA capture and replay run on a GPU in scripts/bench_flow_graphs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.cosyvoice3.flow import load_flow3
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.synthetic.cosyvoice2_flow import write_flow
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# Padding changes only the shapes the kernels see (their summation order).
PADDED_BOUND = 1e-5


class ReplayOnCPU:
    """Stands in for a torch.cuda.CUDAGraph: replay runs the captured function again on its static inputs."""

    def __init__(self, run, out):
        self.run, self.out = run, out

    def replay(self):
        self.out.copy_(self.run())


def cpu_capture(run, device, pool):
    out = run()
    return ReplayOnCPU(run, out), out


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Flow]:
    cosyvoice2 = tmp_path_factory.mktemp("cosyvoice2_tiny")
    write_flow(cosyvoice2, "tiny", seed=0)
    cosyvoice3 = write_cosyvoice3_token2wav(tmp_path_factory.mktemp("cosyvoice3_tiny"), "tiny", seed=0)
    return {"cosyvoice2": load_flow(cosyvoice2), "cosyvoice3": load_flow3(cosyvoice3)}


def _embeddings(flow: Flow, tokens: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, flow.input_embedding.num_embeddings, (1, tokens), generator=gen)
    return flow.input_embedding(ids)


@pytest.mark.parametrize("model", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("lookahead", [0, 3])
@pytest.mark.parametrize("tokens,padded", [(21, 21), (21, 32), (40, 64), (7, 96)])
def test_padded_encoder_equals_the_plain_one_on_the_valid_frames(
    flows: dict[str, Flow], model: str, streaming: bool, lookahead: int, tokens: int, padded: int
) -> None:
    flow = flows[model]
    x = _embeddings(flow, tokens, seed=tokens)
    out_tokens = tokens - lookahead
    with torch.inference_mode():
        context = x[:, out_tokens:] if lookahead else None
        expected = flow.encode(x[:, :out_tokens], torch.tensor([tokens]), context, streaming)
        padded_x = torch.nn.functional.pad(x, (0, 0, 0, padded - tokens))
        got = flow.encode_padded(padded_x, torch.tensor([tokens]), torch.tensor([out_tokens]), streaming)
    frames = flow.token_mel_ratio * out_tokens
    assert expected.shape[1] == frames and got.shape[1] == flow.token_mel_ratio * padded
    assert (got[:, :frames] - expected).abs().max() < PADDED_BOUND


def _request(seed: int, prompt_tokens: int, tokens: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return dict(
        token=torch.randint(0, 6561, (1, tokens), generator=gen),
        token_len=torch.tensor([tokens]),
        prompt_token=torch.randint(0, 6561, (1, prompt_tokens), generator=gen),
        prompt_token_len=torch.tensor([prompt_tokens]),
        prompt_feat=torch.randn(1, 2 * prompt_tokens, 80, generator=gen),
        embedding=torch.randn(1, 192, generator=gen),
    )


@pytest.mark.parametrize("model", ["cosyvoice2", "cosyvoice3"])
def test_conditions_through_the_bucketed_encoder_equal_the_eager_ones(
    flows: dict[str, Flow], model: str
) -> None:
    flow = flows[model]
    encoder = flow.bucketed_encoder(FlowGraphConfig(buckets=(64, 128)), capture=cpu_capture)
    assert encoder.buckets == (32, 64)
    encoder.capture_on_cpu()
    assert encoder.keys == [(False, 32), (False, 64), (True, 32), (True, 64)]
    calls = [
        (_request(1, 12, 18), True, False),  # a first chunk: 30 rows, 27 encoded
        (_request(2, 12, 18), True, True),
        (_request(3, 30, 20), False, True),  # 50 rows: the 64 bucket
        (_request(4, 40, 40), True, True),  # 80 rows: past the largest bucket, the plain encoder
    ]
    with torch.inference_mode():
        flow.encoder_graphs = None
        eager = [flow.conditions(**r, streaming=s, finalize=f) for r, s, f in calls]
        flow.encoder_graphs = encoder
        try:
            bucketed = [flow.conditions(**r, streaming=s, finalize=f) for r, s, f in calls]
        finally:
            flow.encoder_graphs = None
    assert encoder.calls == {"graph": 3, "uncaptured": 1}
    for a, b in zip(eager, bucketed):
        assert a.mu.shape == b.mu.shape
        assert (a.mu - b.mu).abs().max() < PADDED_BOUND


def test_a_bucketed_encoder_refuses_a_cpu_capture_without_a_stand_in(flows: dict[str, Flow]) -> None:
    encoder = flows["cosyvoice2"].bucketed_encoder(FlowGraphConfig(buckets=(64,)))
    with pytest.raises(ValueError, match="CUDA"):
        encoder.capture(512)


def test_too_short_without_finalize_is_refused(flows: dict[str, Flow], tmp_path: Path) -> None:
    request = _request(5, 0, 3)
    request["prompt_feat"] = torch.zeros(1, 0, 80)
    with pytest.raises(ValueError, match="more than 3 tokens"):
        flows["cosyvoice2"].conditions(**request, streaming=True, finalize=False)
