"""Programmatic dependent launch of the batch-1 decode kernels: where it is chosen, and (on an sm_90+ GPU) that the
layers launched with it compute exactly what they compute without."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from triton_interpreter import tiny_model

from tritontts.llm import pdl
from tritontts.llm.engine import LLMEngine
from tritontts.triton.params import parse_auto_bool

REPO = Path(__file__).resolve().parents[1]
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
    """scripts/bench_llm.py's check: the layers one by one and replayed from a CUDA graph, against plain launches."""
    spec = importlib.util.spec_from_file_location("bench_llm", REPO / "scripts" / "bench_llm.py")
    bench_llm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_llm)
    model = tiny_model().to("cuda", torch.bfloat16)
    engine = LLMEngine.from_model(model, max_batch_size=1, max_seq_len=64, decode_pdl=True, cuda_graphs=False)
    assert engine.runner.pdl_shape == dataclasses.replace(engine.runner.shape, pdl=True)
    result = bench_llm.decode_pdl_check(engine.runner)
    assert result == {"max_abs_diff_launched": 0.0, "max_abs_diff_graph": 0.0, "ok": True}
