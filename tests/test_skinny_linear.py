"""The skinny Triton projections of small-batch decode steps (run on CPU by Triton's interpreter) against
`F.linear`, the layer's dispatch (`project`), and the engine's greedy tokens with them against the torch path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_interpreter import IN_INTERPRETER, VOCAB, interpreted, run_under_interpreter, tiny_model

from tritontts.llm.decode_kernels import resolve_decode_attention
from tritontts.llm.engine import LLMEngine
from tritontts.llm.model import LayerShape, add_delta, project
from tritontts.llm.sequence import SamplingParams

CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
RTOL = {torch.float32: 0, torch.bfloat16: 8e-3}  # one bf16 step of the output


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def module():
    return interpreted("tritontts.llm.skinny_linear")


@pytest.fixture(scope="module")
def kernel():
    """The kernel under Triton's CPU interpreter: TRITON_INTERPRET=1 must be set before triton is first imported,
    so these tests run in a process started with it (see the test below)."""
    return interpreted("tritontts.llm.skinny_linear").skinny_linear


@pytest.mark.skipif(IN_INTERPRETER, reason="this process is the interpreter's")
def test_kernels_under_the_triton_interpreter():
    run_under_interpreter(__file__)


def expected(x, w, b, silu_mul):
    out = F.linear(x.float(), w.float(), None if b is None else b.float())
    if silu_mul:
        gate, up = out.chunk(2, dim=-1)
        return F.silu(gate) * up
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows", [1, 3, 4, 17])
@pytest.mark.parametrize("bias, silu_mul", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("out_features, in_features", [(72, 40), (200, 300)])
def test_kernel_equals_f_linear(kernel, dtype, rows, bias, silu_mul, out_features, in_features):
    gen = torch.Generator().manual_seed(rows + out_features)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    w = (torch.randn(out_features, in_features, generator=gen) * in_features**-0.5).to(dtype)
    b = torch.randn(out_features, generator=gen).to(dtype) if bias else None
    out = kernel(x, w, b, silu_mul)
    assert out.dtype == dtype and out.shape == (rows, out_features // 2 if silu_mul else out_features)
    torch.testing.assert_close(
        out.float(), expected(x, w, b, silu_mul), atol=TOLERANCE[dtype], rtol=RTOL[dtype]
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("splits, block_k, shares", [(5, 32, 5), (4, 64, 3), (8, 128, 3), (1, 64, 1)])
def test_shares_sum_to_the_product(module, dtype, splits, block_k, shares):
    gen = torch.Generator().manual_seed(splits)
    x = torch.randn(1, 300, generator=gen).to(dtype)
    w = (torch.randn(40, 300, generator=gen) * 300**-0.5).to(dtype)
    out = module.skinny_linear_partials(x, w, splits, 4, block_k)
    assert out.dtype == torch.float32 and out.shape == (shares, 1, 40)
    torch.testing.assert_close(out.sum(0), expected(x, w, None, False), atol=2e-5, rtol=0)
    chunk = -(-300 // shares // block_k) * block_k
    first = x[:, :chunk].float() @ w[:, :chunk].float().T
    torch.testing.assert_close(out[0], first, atol=2e-5, rtol=0)


def test_project_with_shares_and_add_delta(module):
    shape = LayerShape(2, 1, 16, 1e-6, decode_linear="triton")
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(1, 1, 4096, generator=gen), torch.randn(48, 4096, generator=gen) * 4096**-0.5
    shares = project(shape, x, w, shares=True)
    assert shares.shape == (module.DOWN_SPLITS, 1, 1, 48)
    residual = torch.randn(1, 1, 48, generator=gen).to(torch.bfloat16)
    total = add_delta(residual, shares)
    assert total.dtype == torch.bfloat16
    torch.testing.assert_close(total.float(), (residual.float() + x @ w.T).bfloat16().float())
    plain = project(LayerShape(2, 1, 16, 1e-6), x, w, shares=True)
    assert plain.shape == (1, 1, 48) and torch.equal(
        add_delta(residual, plain.bfloat16()), residual + plain.bfloat16()
    )


def test_other_block_sizes_give_the_same_product(kernel):
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(2, 260, generator=gen), torch.randn(96, 260, generator=gen)
    for width, block_k in ((4, 64), (16, 256), (64, 128)):
        torch.testing.assert_close(kernel(x, w, None, False, width, block_k), x @ w.T, atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "batch, width, silu_mul, used",
    [(1, 48, False, True), (1, 48, True, True), (4, 48, False, True), (4, 48, True, True), (65, 48, False, False),
     (1, 2049, False, False)],
)  # fmt: skip
def test_project_dispatches_decode_steps(kernel, batch, width, silu_mul, used, monkeypatch):
    shape = LayerShape(2, 1, 16, 1e-6, decode_linear="triton")
    calls = []
    op = torch.ops.tritontts.skinny_linear
    monkeypatch.setattr(torch.ops.tritontts, "skinny_linear", lambda *a, **k: calls.append(1) or op(*a, **k))
    gen = torch.Generator().manual_seed(batch)
    x, w = torch.randn(batch, 1, width, generator=gen), torch.randn(64, width, generator=gen) * width**-0.5
    torch_path = project(LayerShape(2, 1, 16, 1e-6), x, w, silu_mul=silu_mul)
    torch.testing.assert_close(project(shape, x, w, silu_mul=silu_mul), torch_path, atol=2e-5, rtol=0)
    assert bool(calls) == used


def test_engine_with_the_kernels_gives_the_torch_tokens(kernel, model):
    prompts = [[5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3], [8, 9], [100, 200, 300, 400, 500]]
    params = SamplingParams(max_tokens=8, temperature=0)
    tokens = {}
    for path in ("torch", "triton"):
        engine = LLMEngine.from_model(
            model, max_batch_size=3, max_seq_len=96, max_top_k=VOCAB, decode_linear=path
        )
        assert engine.runner.shape.decode_linear == path
        tokens[path] = engine.generate(prompts, params)
    assert tokens["triton"] == tokens["torch"]


def test_the_setting_is_resolved_like_decode_attention(monkeypatch, model):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_decode_attention("auto", CPU, setting="decode_linear") == "torch"
    with pytest.raises(ValueError, match="decode_linear='triton' needs a CUDA device"):
        LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_linear="triton")
    with pytest.raises(ValueError, match="decode_linear must be one of"):
        resolve_decode_attention("cublas", CPU, setting="decode_linear")
