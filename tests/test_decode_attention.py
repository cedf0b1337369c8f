"""The fused Triton decode attention (run on CPU by Triton's interpreter) against the torch path, and the
engine setting `decode_attention` that picks it."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
from triton_interpreter import IN_INTERPRETER, VOCAB, interpreted, run_under_interpreter, tiny_model

import tritontts.llm.model as model_module
from tritontts.llm.decode_kernels import resolve_decode_attention
from tritontts.llm.engine import LLMEngine
from tritontts.llm.model import apply_rope, attention, attention_block, decode_lengths
from tritontts.llm.sequence import SamplingParams

CPU = torch.device("cpu")
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def interpreter():
    """The kernel, run by Triton's CPU interpreter: TRITON_INTERPRET=1 must be set before triton is first
    imported and while kernels run, so these tests run in a process started with it (see the test below)."""
    return interpreted("tritontts.llm.decode_attention").decode_attention


@pytest.mark.skipif(IN_INTERPRETER, reason="this process is the interpreter's")
def test_kernels_under_the_triton_interpreter():
    run_under_interpreter(__file__)


def reference(q, k_cache, v_cache, lengths, slot_start):
    """The torch path's attention in fp32 over the first lengths[b] keys of cache row slot_start + b."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    rows = slice(slot_start, slot_start + batch)
    blocked = (torch.arange(k_cache.shape[2]) >= lengths.view(-1, 1, 1)).unsqueeze(1)
    q = q.float().view(batch, kv_heads, heads // kv_heads, dim)
    out = attention(q, k_cache[rows].float(), v_cache[rows].float(), blocked)
    return out.reshape(batch, heads * dim)


def zeros(rows, kv_heads=2):
    return torch.zeros(rows * kv_heads, dtype=torch.int32)


def random_inputs(lengths, dtype, max_len=320, heads=14, kv_heads=2, dim=64, slot_start=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    slots = slot_start + len(lengths) + 1
    q = torch.randn(len(lengths), heads, dim, generator=gen).to(dtype)
    k = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dtype)
    v = torch.randn(slots, kv_heads, max_len, dim, generator=gen).to(dtype)
    return q, k, v, torch.tensor(lengths)


@pytest.mark.parametrize("fold", [True, False], ids=["last_split_combines", "combine_kernel"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("max_len", [320, 64], ids=["splits", "one_split"])
def test_kernel_equals_the_torch_attention(interpreter, dtype, max_len, fold, monkeypatch):
    monkeypatch.setattr("tritontts.llm.decode_attention.FOLD_COMBINE", fold)
    lengths = [1, 17, 64, 300] if max_len > 64 else [1, 17, 40, 64]
    q, k, v, key_lengths = random_inputs(lengths, dtype, max_len)
    out = interpreter(q, k[1:5], v[1:5], key_lengths, q.shape[-1] ** -0.5, zeros(4))
    expected = reference(q, k, v, key_lengths, 1)
    assert out.dtype == dtype and out.shape == (len(lengths), 14 * 64)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=0)
    if dtype != torch.float32:  # as close to fp32 as the torch path in the same dtype
        torch_path = attention(
            q.view(4, 2, 7, 64),
            k[1:5],
            v[1:5],
            (torch.arange(max_len) >= key_lengths.view(-1, 1, 1))[:, None],
        )
        torch_error = (torch_path.reshape(4, -1).float() - expected).abs().max()
        assert (out.float() - expected).abs().max() <= 2 * torch_error


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_rotates_the_queries_with_the_rows_rope(interpreter, dtype):
    lengths = [1, 17, 64, 300]
    q, k, v, key_lengths = random_inputs(lengths, dtype, seed=5)
    gen = torch.Generator().manual_seed(6)
    angles = torch.rand(len(lengths), 32, generator=gen) * 6.28
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1).to(dtype) for f in (torch.cos, torch.sin))
    out = interpreter(q, k[1:5], v[1:5], key_lengths, q.shape[-1] ** -0.5, zeros(4), cos, sin)
    rotated = apply_rope(q, cos[:, None], sin[:, None])
    expected = reference(rotated, k, v, key_lengths, 1)
    torch.testing.assert_close(out.float(), expected, atol=TOLERANCE[dtype], rtol=0)


def test_last_split_combines_given_counters_and_leaves_them_zeroed(interpreter):
    lengths = [1, 17, 64, 300]
    q, k, v, key_lengths = random_inputs(lengths, torch.float32, seed=7)
    counters = torch.zeros(4 * 2, dtype=torch.int32)
    for _ in range(2):  # again: the counters were left as found
        out = interpreter(q, k, v, key_lengths, 0.125, counters, first_slot=1)
        torch.testing.assert_close(out, reference(q, k, v, key_lengths, 1), atol=2e-5, rtol=0)
        assert not counters.any()


@pytest.mark.parametrize("max_len", [320, 64], ids=["splits", "one_split"])
def test_kernel_writes_the_new_rotated_keys_and_values_before_attending(interpreter, max_len):
    positions = torch.tensor([0, 16, 63, 200 if max_len > 64 else 40])
    q, k, v, _ = random_inputs([1, 1, 1, 1], torch.float32, max_len, seed=8)
    gen = torch.Generator().manual_seed(9)
    new_k, new_v = torch.randn(4, 2, 64, generator=gen), torch.randn(4, 2, 64, generator=gen)
    angles = torch.rand(4, 32, generator=gen) * 6.28
    cos, sin = (torch.cat([f(angles)] * 2, dim=-1) for f in (torch.cos, torch.sin))
    expected_k, expected_v = k.clone(), v.clone()
    rows = torch.arange(1, 5)
    expected_k[rows, :, positions] = apply_rope(new_k, cos[:, None], sin[:, None])
    expected_v[rows, :, positions] = new_v
    lengths = positions + 1
    out = interpreter(q, k, v, lengths, 0.125, zeros(4), cos, sin, 1, new_k, new_v, positions)
    torch.testing.assert_close(k, expected_k, atol=1e-6, rtol=0)
    assert torch.equal(v, expected_v)
    rotated = apply_rope(q, cos[:, None], sin[:, None])
    torch.testing.assert_close(out, reference(rotated, k, v, lengths, 1), atol=2e-5, rtol=0)


def test_kernel_with_longer_splits_of_a_big_batch(interpreter):
    lengths = [1 + (37 * i) % 200 for i in range(64)]  # 64 rows x 2 KV heads: splits of 128 keys
    q, k, v, key_lengths = random_inputs(lengths, torch.float32, max_len=200, slot_start=0)
    out = interpreter(q, k[:64], v[:64], key_lengths, 0.125, zeros(64))
    torch.testing.assert_close(out, reference(q, k, v, key_lengths, 0), atol=2e-5, rtol=0)


def test_attention_block_dispatch_equals_the_torch_path(interpreter, model):
    shape = model.layer_shape
    torch.manual_seed(0)
    batch, max_len = 3, 96
    model.init_rope(max_len)
    qkv = torch.randn(batch, 1, (shape.heads + 2 * shape.kv_heads) * shape.head_dim)
    positions = torch.tensor([[0], [33], [70]])
    ctx = model.context(torch.zeros(batch, 1, dtype=torch.int64), positions, slice(0, batch), 64)
    ctx = dataclasses.replace(ctx, lengths=decode_lengths(positions, 64))  # row 2 sees keys 0..63 only
    outputs, caches = [], []
    for path in ("torch", "triton"):
        gen = torch.Generator().manual_seed(1)
        k, v = (torch.randn(4, shape.kv_heads, max_len, shape.head_dim, generator=gen) for _ in "kv")
        layer = dataclasses.replace(shape, decode_attention=path)
        outputs.append(attention_block(layer, qkv, k, v, ctx))
        caches.append((k, v))
    torch.testing.assert_close(outputs[1], outputs[0], atol=2e-5, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(*caches))


def test_engine_with_the_kernel_gives_the_torch_tokens(interpreter, model, monkeypatch):
    prompts = [[5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3], [8, 9], [100, 200, 300, 400, 500]]
    params = SamplingParams(max_tokens=8, temperature=0)
    fused, calls = model_module.fused_decode_attention, []
    monkeypatch.setattr(model_module, "fused_decode_attention", lambda *a: calls.append(1) or fused(*a))
    tokens = {}
    for path in ("torch", "triton"):
        engine = LLMEngine.from_model(
            model, max_batch_size=3, max_seq_len=96, max_top_k=VOCAB, decode_attention=path
        )
        assert engine.runner.shape.decode_attention == path
        tokens[path] = engine.generate(prompts, params)
        assert bool(calls) == (path == "triton")
    assert tokens["triton"] == tokens["torch"]


def test_auto_picks_torch_on_cpu(monkeypatch, model):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_decode_attention("auto", CPU) == "torch"
    assert resolve_decode_attention("torch", torch.device("cuda")) == "torch"
    engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, cuda_graphs=False)
    assert engine.runner.decode_attention == "torch"
    assert engine.runner.shape.decode_attention == "torch"


def test_triton_where_it_cannot_run_is_refused(monkeypatch, model):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="decode_attention='triton' needs a CUDA device"):
        resolve_decode_attention("triton", CPU)
    with pytest.raises(ValueError, match="decode_attention='triton'"):
        LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_attention="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setitem(sys.modules, "tritontts.llm.decode_attention", None)  # as if triton were absent
    with pytest.raises(ValueError, match="decode_attention='triton' needs the triton package"):
        resolve_decode_attention("triton", CPU)
    assert resolve_decode_attention("auto", torch.device("cuda")) == "torch"
    with pytest.raises(ValueError, match="decode_attention='triton' needs a power-of-two head_dim"):
        resolve_decode_attention("triton", CPU, head_dim=80)
    with pytest.raises(ValueError, match="decode_attention must be one of"):
        resolve_decode_attention("flash", CPU)
