"""The batch-1 projections with the residual add and RMSNorm inside (run on CPU by Triton's interpreter) against
the torch ops they replace, and the engine's greedy tokens through them against the torch path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_interpreter import IN_INTERPRETER, VOCAB, interpreted, run_under_interpreter, tiny_model

from tritontts.llm.engine import LLMEngine
from tritontts.llm.model import (
    LayerShape,
    add_delta,
    decoder_layer,
    norm_project,
    norms_in_projections,
    rms_norm,
)
from tritontts.llm.sequence import SamplingParams

EPS = 1e-6
TOLERANCE = {torch.float32: (2e-5, 0), torch.bfloat16: (6e-2, 2e-2)}
"""bf16: the interpreter's casts truncate where the GPU's round to nearest, and the kernel rounds its input twice
(the normalized row, then times the norm's weight) as the torch ops do; fp32 checks the arithmetic exactly."""


@pytest.fixture(scope="module")
def module():
    return interpreted("tritontts.llm.norm_linear")


@pytest.mark.skipif(IN_INTERPRETER, reason="this process is the interpreter's")
def test_kernels_under_the_triton_interpreter():
    run_under_interpreter(__file__)


def deltas(kind: str, width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "shares":
        return torch.randn(4, 1, width, generator=gen)  # fp32, as skinny_linear_partials writes them
    return torch.randn(1, 1, width, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("delta_kind", ["none", "shares", "row"])
@pytest.mark.parametrize("bias, silu_mul", [(True, False), (False, True)])
@pytest.mark.parametrize("out_features, in_features", [(72, 40), (200, 896)])
def test_kernel_equals_add_norm_and_linear(
    module, dtype, delta_kind, bias, silu_mul, out_features, in_features
):
    gen = torch.Generator().manual_seed(out_features + in_features)
    x = torch.randn(1, in_features, generator=gen).to(dtype)
    delta = deltas(delta_kind, in_features, dtype, gen)
    norm_w = (1 + 0.1 * torch.randn(in_features, generator=gen)).to(dtype)
    w = (torch.randn(out_features, in_features, generator=gen) * in_features**-0.5).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    out, residual = module.norm_linear(x, delta, norm_w, EPS, w, b, silu_mul)

    expected_residual = x if delta is None else add_delta(x, delta if delta_kind == "shares" else delta[0])
    # exact in fp32; the interpreter's casts to bf16 truncate where the GPU's round to nearest: one bf16 step
    torch.testing.assert_close(
        residual, expected_residual, atol=0, rtol=0 if dtype == torch.float32 else 8e-3
    )
    full = F.linear(
        rms_norm(expected_residual, norm_w, EPS).float(), w.float(), None if b is None else b.float()
    )
    if silu_mul:
        gate, up = full.chunk(2, dim=-1)
        full = F.silu(gate) * up
    atol, rtol = TOLERANCE[dtype]
    assert out.dtype == dtype and out.shape == (1, full.shape[-1])
    torch.testing.assert_close(out.float(), full, atol=atol, rtol=rtol)


def test_a_layer_with_the_norms_inside_equals_the_torch_layer(module):
    model = tiny_model()
    torch_shape = model.layer_shape
    shape = LayerShape(**{**torch_shape.__dict__, "decode_linear": "triton"})
    gen = torch.Generator().manual_seed(5)
    width = model.config.hidden_size
    x = torch.randn(1, 1, width, generator=gen)
    delta = torch.randn(4, 1, 1, width, generator=gen)
    assert norms_in_projections(shape, x) and not norms_in_projections(torch_shape, x)
    assert not norms_in_projections(shape, torch.randn(2, 1, width))
    weights = model.model.layers[0].weights()
    residual, qkv = norm_project(shape, x, delta, weights[0], weights[1], weights[2])
    torch.testing.assert_close(residual, add_delta(x, delta), atol=0, rtol=0)
    torch.testing.assert_close(qkv, F.linear(rms_norm(add_delta(x, delta), weights[0], EPS), *weights[1:3]))
    assert decoder_layer.__name__ == "decoder_layer"


def test_engine_at_batch_one_gives_the_torch_tokens(module, monkeypatch):
    model = tiny_model()
    calls = []
    op = torch.ops.tritontts.norm_linear
    monkeypatch.setattr(torch.ops.tritontts, "norm_linear", lambda *a, **k: calls.append(1) or op(*a, **k))
    params = SamplingParams(max_tokens=10, temperature=0)
    tokens = {}
    for path in ("torch", "triton"):
        engine = LLMEngine.from_model(
            model, max_batch_size=2, max_seq_len=96, max_top_k=VOCAB, decode_linear=path
        )
        tokens[path] = engine.generate([[5, 17, 912, 33, 4, 250, 251, 7]], params)
    assert tokens["triton"] == tokens["torch"]
    assert len(calls) >= 2 * model.config.num_hidden_layers * 9  # two a layer, every decode step
