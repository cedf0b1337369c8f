"""Fused q/k/v projections (tritontts.qkv): every loaded flow (CosyVoice2, CosyVoice3, the Step-Audio-2 DiT)
runs one matrix multiply per attention where the checkpoint has three, with the outputs of the three; the
whole CosyVoice2 estimator gives the unfused one's velocity and runs 2 GEMMs fewer per transformer block."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from estimator_inputs import estimator_inputs
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tritontts.checkpoint import build_and_load
from tritontts.conv_gemm import pack_convs
from tritontts.cosyvoice2.config import load_cosyvoice2_config
from tritontts.cosyvoice2.flow import FLOW_FILE, Flow, load_flow
from tritontts.cosyvoice3.config import load_cosyvoice3_config
from tritontts.cosyvoice3.flow import Flow3, load_flow3
from tritontts.dit_token2wav.config import load_dit_flow_config
from tritontts.dit_token2wav.flow import DiTFlow, load_dit_flow
from tritontts.qkv import QKVProjection, fuse_qkv, unfuse_qkv
from tritontts.synthetic.cosyvoice2_flow import write_flow
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# One GEMM over the stacked weight instead of three: the same dot products, possibly blocked differently.
FUSED_BOUND = 1e-5


def _cosyvoice2(root: Path) -> tuple[nn.Module, Callable[[], nn.Module]]:
    write_flow(root, "tiny", seed=0)
    config = load_cosyvoice2_config(root).flow
    return load_flow(root), lambda: Flow(config)


def _cosyvoice3(root: Path) -> tuple[nn.Module, Callable[[], nn.Module]]:
    model_dir = write_cosyvoice3_token2wav(root, "tiny", seed=0)
    config = load_cosyvoice3_config(model_dir).flow
    return load_flow3(model_dir), lambda: Flow3(config)


def _dit(root: Path) -> tuple[nn.Module, Callable[[], nn.Module]]:
    model_dir = write_dit_token2wav(root, "tiny", seed=0)
    config = load_dit_flow_config(model_dir)
    return load_dit_flow(model_dir), lambda: DiTFlow(config)


FAMILIES = {"cosyvoice2": _cosyvoice2, "cosyvoice3": _cosyvoice3, "cosyvoice2_dit": _dit}


@pytest.fixture(scope="module", params=list(FAMILIES))
def fused_and_plain(request, tmp_path_factory) -> tuple[nn.Module, nn.Module]:
    root = tmp_path_factory.mktemp(request.param)
    fused, build = FAMILIES[request.param](root)
    weights = next(p for p in (root / FLOW_FILE, *root.glob(f"*/{FLOW_FILE}")) if p.exists())
    plain = build_and_load(build, weights, "cpu", lambda f: f.decoder.reset_noise()).eval()
    return fused, plain


def attentions(module: nn.Module) -> list[QKVProjection]:
    return [m for m in module.modules() if isinstance(m, QKVProjection)]


def test_every_attention_of_a_loaded_flow_is_fused(fused_and_plain):
    fused, plain = fused_and_plain
    assert attentions(fused) and all(a.to_qkv is not None for a in attentions(fused))
    assert not any(hasattr(a, "to_q") for a in attentions(fused))
    assert all(a.to_qkv is None for a in attentions(plain))
    assert fuse_qkv(fused) == 0  # fusing twice changes nothing


def test_the_fused_projection_gives_the_three_projections(fused_and_plain):
    fused, plain = fused_and_plain
    gen = torch.Generator().manual_seed(0)
    for one, three in zip(attentions(fused), attentions(plain), strict=True):
        x = torch.randn(2, 9, three.to_q.in_features, generator=gen)
        with torch.no_grad():
            for got, want in zip(one.project(x), three.project(x), strict=True):
                torch.testing.assert_close(got, want, atol=FUSED_BOUND, rtol=0)


def test_unfusing_gives_back_the_checkpoint_projections(fused_and_plain):
    fused, plain = fused_and_plain
    unfused = copy.deepcopy(fused)
    assert unfuse_qkv(unfused) == len(attentions(fused)) and unfuse_qkv(unfused) == 0
    for again, three in zip(attentions(unfused), attentions(plain), strict=True):
        for name in ("to_q", "to_k", "to_v"):
            for got, want in zip(
                getattr(again, name).parameters(), getattr(three, name).parameters(), strict=True
            ):
                torch.testing.assert_close(got, want, atol=0, rtol=0)


def _gemms(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = run()
    names = ("aten::mm", "aten::addmm", "aten::bmm")
    return out, sum(e.count for e in prof.key_averages() if e.key in names)


def test_the_cosyvoice2_estimator_keeps_its_velocity_with_two_gemms_fewer_per_block(tmp_path):
    fused_flow, build = _cosyvoice2(tmp_path)
    plain_flow = build_and_load(build, tmp_path / FLOW_FILE, "cpu", lambda f: f.decoder.reset_noise()).eval()
    pack_convs(plain_flow)  # as loading does: the two differ in q/k/v alone
    fused, plain = fused_flow.decoder.estimator, plain_flow.decoder.estimator
    inputs = estimator_inputs(fused.config.out_channels)
    for streaming in (False, True):
        with torch.no_grad():
            got, fused_gemms = _gemms(lambda s=streaming: fused(*inputs, s))
            want, plain_gemms = _gemms(lambda s=streaming: plain(*inputs, s))
        torch.testing.assert_close(got, want, atol=FUSED_BOUND, rtol=0)
        assert plain_gemms - fused_gemms == 2 * len(attentions(fused)), (plain_gemms, fused_gemms)
