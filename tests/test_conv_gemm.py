"""Packed convolutions (tritontts.conv_gemm): one GEMM over time-major memory gives cuDNN's convolution, alone
and inside the CosyVoice2 estimator and the DiT, whole, chunk by chunk and right-padded."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from estimator_inputs import estimator_inputs

from tritontts.conv_gemm import CausalConv1d, PointwiseConv1d, pack_convs, unpack_convs
from tritontts.cosyvoice2.flow.flow import load_flow
from tritontts.dit_token2wav.dit import frame_padding
from tritontts.dit_token2wav.flow import load_dit_flow
from tritontts.synthetic.cosyvoice2_flow import write_flow
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# The same products summed in another order (one GEMM over 3C inputs instead of the convolution's blocking).
PACKED_BOUND = 1e-5


def _time_major(x: torch.Tensor) -> torch.Tensor:
    """x [B, C, T] as a view of [B, T, C] memory."""
    return x.mT.contiguous().mT


@pytest.mark.parametrize("layout", [lambda x: x, _time_major], ids=["channel-major", "time-major"])
def test_a_packed_causal_convolution_gives_the_convolution(layout):
    gen = torch.Generator().manual_seed(0)
    conv = CausalConv1d(6, 5, 3)
    x = layout(torch.randn(2, 6, 11, generator=gen))
    with torch.no_grad():
        want = conv(x)
        assert conv.packed_weight is None and pack_convs(conv) == 1
        got = conv(x)
    assert got.shape == want.shape == (2, 5, 11)
    assert got.mT.is_contiguous()
    torch.testing.assert_close(got, want, atol=PACKED_BOUND, rtol=0)
    history = layout(torch.randn(2, 6, 13, generator=gen))
    with torch.no_grad():
        torch.testing.assert_close(
            conv.over_history(history),
            torch.conv1d(history, conv.weight, conv.bias),
            atol=PACKED_BOUND,
            rtol=0,
        )


def test_frame_t_sees_no_later_frame_when_packed():
    conv = CausalConv1d(4, 4, 3)
    pack_convs(conv)
    x = torch.randn(1, 4, 8)
    later = x.clone()
    later[..., 5:] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(conv(x)[..., :5], conv(later)[..., :5], atol=0, rtol=0)
        assert not torch.allclose(conv(x)[..., 5:], conv(later)[..., 5:])


def test_a_packed_pointwise_convolution_gives_the_convolution():
    conv = PointwiseConv1d(6, 3)
    x = torch.randn(2, 6, 7)
    with torch.no_grad():
        want = conv(x)
        pack_convs(conv)
        torch.testing.assert_close(conv(x), want, atol=PACKED_BOUND, rtol=0)


def test_loading_packs_keeps_the_checkpoint_layout_and_unpacks(tmp_path: Path):
    write_flow(tmp_path, "tiny", seed=0)
    flow = load_flow(tmp_path)
    keys = set(flow.state_dict())
    packed = unpack_convs(flow)
    assert packed > 0 and set(flow.state_dict()) == keys
    assert pack_convs(flow) == packed and set(flow.state_dict()) == keys
    flow.load_state_dict(copy.deepcopy(flow.state_dict()), strict=True)
    assert flow.to(torch.float64).decoder.estimator.final_proj.packed_weight.dtype == torch.float64
    assert unpack_convs(flow) == packed and unpack_convs(flow) == 0


def test_the_cosyvoice2_estimator_keeps_its_velocity_packed(tmp_path: Path):
    write_flow(tmp_path, "tiny", seed=0)
    estimator = load_flow(tmp_path).decoder.estimator
    inputs = estimator_inputs(estimator.config.out_channels)
    for streaming in (False, True):
        with torch.no_grad():
            unpack_convs(estimator)
            want = estimator(*inputs, streaming)
            pack_convs(estimator)
            got = estimator(*inputs, streaming)
        torch.testing.assert_close(got, want, atol=PACKED_BOUND, rtol=0)


def test_the_dit_keeps_its_velocity_and_caches_packed(tmp_path: Path):
    dit = load_dit_flow(write_dit_token2wav(tmp_path, "tiny", seed=0)).decoder.estimator
    gen = torch.Generator().manual_seed(2)
    mel = dit.config.out_channels

    def inputs(frames: int) -> list[torch.Tensor]:
        return [torch.randn(2, mel, frames, generator=gen) for _ in range(2)] + [
            torch.rand(2, generator=gen),
            torch.randn(2, mel, generator=gen),
            torch.randn(2, mel, frames, generator=gen),
        ]

    whole, first, second = inputs(12), inputs(8), inputs(6)
    padding = frame_padding(torch.tensor([6, 4]), 6, torch.tensor([8, 8]), 8)

    def run() -> list[torch.Tensor]:
        with torch.no_grad():
            velocity, _ = dit(*whole)
            v1, cache = dit(*first, cache=dit.empty_cache(2, torch.device("cpu"), torch.float32))
            v2, cache2 = dit(*second, cache=cache, padding=padding)
        return [velocity, v1, cache.cnn, cache.att, v2, cache2.cnn]

    assert unpack_convs(dit) == 2 * dit.config.depth  # loading packed them
    want = run()
    assert pack_convs(dit) == 2 * dit.config.depth
    for got, expected in zip(run(), want, strict=True):
        torch.testing.assert_close(got, expected, atol=PACKED_BOUND, rtol=0)
