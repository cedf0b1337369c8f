"""Programmatic dependent launch of the batch-1 decode kernels: where it is chosen, and (on an sm_90+ GPU) that the
layers launched with it compute exactly what they compute without."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from triton_interpreter import tiny_model

from tritontts.llm import pdl
from tritontts.llm.engine import LLMEngine
from tritontts.llm.model import LayerShape, decode_lengths, decoder_layer
from tritontts.triton.params import parse_auto_bool

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def test_auto_leaves_it_off_where_it_cannot_run():
    model = tiny_model()
    for wanted in (None, False):
        engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_pdl=wanted)
        assert engine.runner.pdl_shape is None
    with pytest.raises(ValueError, match="decode_pdl needs a CUDA device, not cpu"):
        LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_pdl=True)


def test_the_problem_names_what_is_missing(monkeypatch):
    if pdl.gdc_wait is None:
        assert "griddepcontrol" in pdl.pdl_problem(torch.device("cuda"))
        return
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert pdl.pdl_problem(torch.device("cuda")) == "needs compute capability 9.0 or later (Hopper), not 8.x"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert pdl.pdl_problem(torch.device("cuda")) is None
    assert pdl.launch_options(True) == {"launch_pdl": True} and pdl.launch_options(False) == {}


@pytest.mark.parametrize("text, value", [("auto", None), ("AUTO", None), ("true", True), ("false", False)])
def test_the_model_parameter(text, value):
    assert parse_auto_bool(text) is value
    with pytest.raises(ValueError, match="not a boolean"):
        parse_auto_bool("sometimes")


@pytest.mark.skipif(not HOPPER, reason="needs an sm_90+ GPU")
def test_layers_launched_with_pdl_equal_the_plain_launches():
    model = tiny_model().to("cuda", torch.bfloat16)
    engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_pdl=True, cuda_graphs=False)
    runner = engine.runner
    assert runner.pdl_shape == dataclasses.replace(runner.shape, pdl=True)
    positions = torch.full((1, 1), 20, device="cuda")
    ctx = runner.model.context(torch.zeros_like(positions), positions, slice(0, 1), 64)
    counters = torch.zeros(model.config.num_key_value_heads, dtype=torch.int32, device="cuda")
    ctx = dataclasses.replace(ctx, lengths=decode_lengths(positions, 64), counters=counters)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x0 = torch.randn(1, 1, model.config.hidden_size, generator=gen, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(runner.cache.k[0].shape, generator=gen, device="cuda", dtype=torch.bfloat16)

    def layers(shape: LayerShape) -> torch.Tensor:
        x, delta, keys = x0, None, []
        for weights in runner.weights:
            k, v = cache.clone(), cache.clone()
            x, delta = decoder_layer(shape, weights, x, delta, k, v, ctx)
            keys.append(k[0, :, 20])
        return torch.cat([x.float().flatten(), delta.float().flatten(), torch.stack(keys).float().flatten()])

    torch.testing.assert_close(layers(runner.pdl_shape), layers(runner.shape), atol=0, rtol=0)
