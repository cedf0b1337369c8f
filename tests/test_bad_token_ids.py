"""Per-request bad token ids: the engine never samples them (eager, padded-bucket and prefill-bucket paths),
requests without any are unchanged, and `bad_words_list` / `logit_bias` map onto them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tritontts.llm.config import Qwen2Config
from tritontts.llm.engine import LLMEngine
from tritontts.llm.loader import build_model
from tritontts.llm.openai_server.protocol import CompletionRequest
from tritontts.llm.sampling import mask_bad_ids
from tritontts.llm.sequence import SamplingParams
from tritontts.llm.slot_state import MAX_BAD_TOKENS
from tritontts.llm.triton_io import parse_bad_words, parse_llm_request
from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict
from tritontts.triton.llm_contract import SamplingParams as ContractParams
from tritontts.triton.llm_contract import llm_request_inputs
from tritontts.triton.params import RequestError

VOCAB = 1000
PROMPTS = [[5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3], [8, 9], [100, 200, 300, 400, 500]]
GREEDY = SamplingParams(max_tokens=12, temperature=0)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, seed=99)
ENGINES = {
    "eager": {},
    "padded": {"cuda_graphs": True, "max_batch_size": 8},
    "prefill_buckets": {"prefill_lengths": [8, 16, 32], "kv_lengths": [16, 32, 64]},
}


@pytest.fixture(scope="module")
def model():
    config = Qwen2Config.from_dict(qwen2_config("tiny", vocab_size=VOCAB))
    return build_model(
        config, qwen2_state_dict("tiny", seed=3, vocab_size=VOCAB), "cpu", torch.float32, "synthetic"
    )


def make_engine(model, **options) -> LLMEngine:
    options = {"max_batch_size": 4, **options}
    return LLMEngine.from_model(model, max_seq_len=96, max_top_k=VOCAB, **options)


def test_mask_bad_ids_pads_without_touching_other_logits():
    logits = torch.arange(12.0).view(2, 6)
    bad = torch.tensor([[4, 1, 4, 4], [-1, -1, -1, -1]])
    masked = mask_bad_ids(logits, bad)
    assert masked[0].tolist() == [0, float("-inf"), 2, 3, float("-inf"), 5]
    assert torch.equal(masked[1], logits[1])


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("path", ENGINES)
def test_banned_tokens_never_come_and_others_are_unchanged(model, path, params):
    plain = make_engine(model).generate(PROMPTS, params)
    banned = tuple(sorted({t for out in plain[:2] for t in out}))
    masked = SamplingParams(**{**params.__dict__, "bad_token_ids": banned})
    outs = make_engine(model, **ENGINES[path]).generate(PROMPTS, [masked, masked, params])
    assert all(t not in banned for out in outs[:2] for t in out)
    assert outs[2] == plain[2], "a request without bad ids next to masked ones changed"
    assert outs[:2] != plain[:2]


def test_bad_ids_out_of_range_or_too_many_are_refused(model):
    engine = make_engine(model)
    with pytest.raises(ValueError, match="bad_token_ids"):
        engine.add_request([1, 2], SamplingParams(bad_token_ids=(VOCAB,)))
    with pytest.raises(ValueError, match="bad_token_ids"):
        engine.add_request([1, 2], SamplingParams(bad_token_ids=tuple(range(MAX_BAD_TOKENS + 1))))
    with pytest.raises(ValueError, match="bad_token_ids"):
        SamplingParams(bad_token_ids=(-3,))


def _request(**extra: np.ndarray):
    inputs = llm_request_inputs(np.array([1, 2, 3]), 7, 7, ContractParams(max_tokens=4), False)
    inputs.update(extra)
    return parse_llm_request(inputs.get, VOCAB, False)


def test_bad_words_list_round_trips_through_the_contract():
    inputs = llm_request_inputs(np.array([1, 2]), 7, 7, ContractParams(), False, bad_ids=[5, 9, 300])
    assert inputs["bad_words_list"].tolist() == [[[5, 9, 300], [1, 2, 3]]]
    assert parse_llm_request(inputs.get, VOCAB, False).params.bad_token_ids == (5, 9, 300)
    assert _request().params.bad_token_ids == ()
    padded = np.array([[5, 9, 0, 0], [1, 2, -1, -1]], dtype=np.int32)
    assert parse_bad_words(padded, VOCAB) == (5, 9)
    assert parse_bad_words(np.zeros((1, 2, 0), dtype=np.int32), VOCAB) == ()


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.array([[5, 6, 7], [1, 3, -1]]), "single-token"),
        (np.array([[5, 6], [1, 2], [0, 0]]), "shape"),
        (np.array([[5, 6, 7], [1, -1, 3]]), "padding"),
        (np.array([[5, VOCAB], [1, 2]]), "ids must be"),
        (np.array([[-2], [1]]), "ids must be"),
    ],
)
def test_bad_words_list_rejects_other_forms(array, message):
    with pytest.raises(RequestError, match=message) as error:
        _request(bad_words_list=array.astype(np.int32)[None] if array.ndim == 2 else array)
    assert "bad_words_list" in str(error.value)


def test_logit_bias_takes_only_bans():
    assert CompletionRequest(prompt=[1], logit_bias={"5": -100, "9": -100}).banned_ids() == (5, 9)
    assert CompletionRequest(prompt=[1]).banned_ids() == ()
    with pytest.raises(ValueError, match="only -100"):
        CompletionRequest(prompt=[1], logit_bias={"5": 3}).banned_ids()
    with pytest.raises(ValueError, match="token ids"):
        CompletionRequest(prompt=[1], logit_bias={"a": -100}).banned_ids()
