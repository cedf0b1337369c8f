"""The flow estimator that `--token2wav_compile` puts in the flow's CUDA graphs (torch.compile, inductor) against
the plain one, on CPU, for CosyVoice2's U-Net, CosyVoice3's DiT and Step-Audio-2's DiT (cosyvoice2_dit): the same
mel over 10 Euler steps of a streamed chunk (the pair of CFG rows as the graph runs them; the Step-Audio-2 DiT's
padded over a cache, with its cache entries) within the summation-order spread of fused kernels. On a GPU,
`scripts/bench_flow_graphs.py --compile-frames` compares CosyVoice2's graphed compiled flow in fp16."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.cosyvoice2.flow.graphs import GraphedCFM
from tritontts.cosyvoice3.flow import load_flow3
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.dit_token2wav.flow import load_dit_flow
from tritontts.dit_token2wav.graphs import DiTFlowGraphConfig, FlowRow, GraphedDiTCFM
from tritontts.synthetic.cosyvoice2_flow import write_flow
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
STEPS = 10
FRAMES = 40
# Inductor's fused kernels sum in another order: measured 3.2e-6 (CosyVoice2), 3.3e-6 (CosyVoice3), 2.4e-6 (DiT).
COMPILED_BOUND = 2e-5


def cosyvoice2_flow(directory: Path) -> Flow:
    write_flow(directory, "tiny", seed=0)
    return load_flow(directory)


def cosyvoice3_flow(directory: Path) -> Flow:
    return load_flow3(write_cosyvoice3_token2wav(directory, "tiny", seed=0))


@pytest.mark.parametrize("make_flow", [cosyvoice2_flow, cosyvoice3_flow], ids=["cosyvoice2", "cosyvoice3"])
def test_the_compiled_estimator_gives_the_plain_estimators_mel(make_flow, tmp_path: Path) -> None:
    flow = make_flow(tmp_path)
    decoder = flow.decoder
    compiled = GraphedCFM(decoder, STEPS, FlowGraphConfig(buckets=(64,), compile=True)).captured_estimator
    generator = torch.Generator().manual_seed(1)
    bins = decoder.mel_bins
    mu = torch.randn(1, bins, FRAMES, generator=generator)
    cond = torch.zeros(1, bins, FRAMES)
    cond[:, :, : FRAMES // 3] = torch.randn(1, bins, FRAMES // 3, generator=generator)
    spks = torch.randn(1, bins, generator=generator)
    with torch.inference_mode():
        guided = decoder.guided_inputs(mu, torch.ones(1, 1, FRAMES), spks, cond)
        start = decoder.start(1, FRAMES, mu.dtype)
        plain = decoder.solve(start, *guided, STEPS, True)
        through_compiled = decoder.solve(start, *guided, STEPS, True, compiled)
    error = (through_compiled - plain).abs().max().item()
    print(f"{make_flow.__name__}: compiled against plain, max |difference| {error:.2e}")
    assert plain.abs().max() > 0.1
    assert error < COMPILED_BOUND


def test_the_compiled_dit_estimator_gives_the_plain_chunk(tmp_path: Path) -> None:
    """Step-Audio-2's DiT (cosyvoice2_dit) as `GraphedDiTCFM` captures it compiled: a padded chunk over a cache,
    the mel and the chunk's own cache entries."""
    flow = load_dit_flow(write_dit_token2wav(tmp_path, "tiny", seed=0))
    decoder = flow.decoder
    config = DiTFlowGraphConfig(buckets=(64,), chunk_buckets=(64,), cache_buckets=(64,), compile=True)
    graphed = GraphedDiTCFM(decoder, STEPS, config)
    assert graphed.captured_estimator._orig_mod is decoder.estimator
    generator = torch.Generator().manual_seed(2)
    bins = decoder.mel_bins

    def chunk(frames: int) -> tuple[torch.Tensor, ...]:
        return tuple(torch.randn(*shape, generator=generator) for shape in ((1, bins, frames), (1, bins)))

    mu, spks = chunk(20)
    cond = torch.zeros_like(mu)
    with torch.inference_mode():
        _, cache = decoder.forward_chunk(mu, spks, cond, STEPS)
        mu, _ = chunk(FRAMES)
        inputs = graphed._inputs((True, 1, 64, 64), shared=False)
        graphed._fill(inputs, [FlowRow(mu, spks, torch.zeros_like(mu), cache)])
        plain, plain_entries = graphed._solve(inputs)
        compiled, compiled_entries = graphed._solve(inputs, graphed.captured_estimator)
    error = max(
        (compiled - plain)[:, :, :FRAMES].abs().max().item(),
        (compiled_entries.att - plain_entries.att).abs().max().item(),
    )
    print(f"DiT: compiled against plain, max |difference| {error:.2e}")
    assert plain.abs().max() > 0.1
    assert error < COMPILED_BOUND
