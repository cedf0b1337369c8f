"""The Triton top-k (run on CPU by Triton's interpreter) against `torch.topk`, and the engine's tokens with it
against the torch path."""

from __future__ import annotations

import pytest
import torch
from triton_interpreter import IN_INTERPRETER, VOCAB, interpreted, run_under_interpreter, tiny_model

from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import SamplingParams


@pytest.fixture(scope="module")
def module():
    return interpreted("tritontts.llm.top_k")


@pytest.mark.skipif(IN_INTERPRETER, reason="this process is the interpreter's")
def test_kernels_under_the_triton_interpreter():
    run_under_interpreter(__file__)


def logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    x[0, 5] = float("-inf")  # a masked end id
    x[-1, ::7] = -x[-1, ::7].abs()  # negative values in every chunk
    return x


@pytest.mark.parametrize("k, chunk", [(1, 64), (5, 128), (50, 128), (64, 512), (64, 2048), (300, 1024)])
def test_values_and_ids_equal_torch_topk(module, k, chunk):
    x = logits(3, VOCAB, k)
    values, ids = module.top_k(x, k, 0, chunk)
    reference = x.topk(k, dim=-1)
    assert torch.equal(values, reference.values)
    assert torch.equal(x.gather(1, ids), values)
    assert ids.dtype == torch.int64


def test_the_full_sort_path_of_older_tritons(module, monkeypatch):
    """Tritons without `tl.topk` sort the whole chunk and store its first K keys."""
    monkeypatch.setattr(module, "HAS_TOPK", False)
    x = logits(2, VOCAB, 1)
    values, ids = module.top_k(x, 50, 64, 128)
    assert torch.equal(values[:, :50], x.topk(50, dim=-1).values)
    assert torch.equal(x.gather(1, ids[:, :50]), values[:, :50])
    assert torch.isneginf(values[:, 50:]).all() and (ids[:, 50:] == 0).all()


def test_ties_go_to_the_lower_id(module):
    x = torch.zeros(2, 700)
    x[1, 600:] = 1.0
    values, ids = module.top_k(x, 8, 0, 128)
    assert ids[0].tolist() == list(range(8)) and ids[1].tolist() == list(range(600, 608))


def test_candidates_past_k_are_minus_infinity_with_id_zero(module):
    x = logits(2, VOCAB, 0)
    values, ids = module.top_k(x, 64, 200, 512)
    assert values.shape == ids.shape == (2, 200)
    assert torch.equal(values[:, :64], x.topk(64, dim=-1).values)
    assert torch.isneginf(values[:, 64:]).all() and (ids[:, 64:] == 0).all()


def test_bad_arguments_are_refused(module):
    with pytest.raises(ValueError, match="half the chunk"):
        module.top_k(logits(1, VOCAB, 0), 64, 0, 64)
    with pytest.raises(ValueError, match="fp32"):
        module.top_k(logits(1, VOCAB, 0).double(), 4, 0, 128)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=4, temperature=0.9, top_k=40, top_p=0.9, seed=11),
        SamplingParams(max_tokens=4, temperature=0),
    ],
    ids=["sampled", "greedy"],
)
def test_engine_tokens_equal_the_torch_path(module, monkeypatch, params):
    model = tiny_model()
    calls = []
    op = torch.ops.tritontts.top_k
    monkeypatch.setattr(torch.ops.tritontts, "top_k", lambda *a: calls.append(1) or op(*a))
    tokens = {}
    for path in ("torch", "triton"):
        engine = LLMEngine.from_model(
            model, max_batch_size=2, max_seq_len=96, max_top_k=VOCAB, top_k_kernel=path
        )
        tokens[path] = engine.generate([[5, 17, 912, 33, 4, 250, 251, 7], [8, 9]], params)
    assert tokens["triton"] == tokens["torch"]
    assert len(calls) >= 3  # every decode step (each takes seconds in the interpreter: 4 tokens, not more)
