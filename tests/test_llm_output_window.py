"""The engine's output window (`output_tokens_from`): the head computes vocabulary rows from a first id on only.

Against the full head with every id below the window masked (`bad_token_ids`), the same requests give the same
tokens, greedy and sampled, batched, through the padded prefill path and the eager one."""

import pytest
import torch
from tokenizers import Tokenizer, models

from tritontts.checkpoint import CheckpointError
from tritontts.llm.config import Qwen2Config
from tritontts.llm.engine import LLMEngine
from tritontts.llm.loader import build_model, output_token_id
from tritontts.llm.sequence import SamplingParams
from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict

VOCAB = 1000
START = 200
PROMPTS = [[5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3], [8, 9], [300, 400, 500, 201], [42] * 7]
SAMPLED = dict(max_tokens=12, temperature=0.9, top_k=40, top_p=0.9, repetition_penalty=1.3, seed=77)
GREEDY = dict(max_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def model():
    config = Qwen2Config.from_dict(qwen2_config("tiny", vocab_size=VOCAB))
    return build_model(
        config, qwen2_state_dict("tiny", seed=5, vocab_size=VOCAB), "cpu", torch.float32, "synthetic"
    )


def engine(model, start, **options) -> LLMEngine:
    return LLMEngine.from_model(
        model, max_batch_size=3, max_seq_len=64, max_top_k=VOCAB, output_tokens_from=start, **options
    )


def test_windowed_logits_are_the_full_logits_from_the_first_id(model):
    x, delta = torch.randn(2, 3, model.config.hidden_size), torch.zeros(2, 3, model.config.hidden_size)
    full = model.head(x, delta, last_only=False)
    assert torch.equal(model.head(x, delta, last_only=False, output_start=START), full[..., START:])


@pytest.mark.parametrize("settings", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("prefill_lengths", [None, [16, 32]], ids=["eager", "padded"])
def test_window_gives_the_tokens_of_the_full_head_with_the_ids_below_masked(model, settings, prefill_lengths):
    end_id = 333
    windowed = SamplingParams(**settings, end_id=end_id, min_tokens=2)
    masked = SamplingParams(**settings, end_id=end_id, min_tokens=2, bad_token_ids=tuple(range(START)))
    options = {"prefill_lengths": prefill_lengths} if prefill_lengths else {}
    got = engine(model, START, **options).generate(PROMPTS, windowed)
    want = engine(model, 0, **options).generate(PROMPTS, masked)
    assert got == want
    assert all(START <= t < VOCAB for tokens in got for t in tokens)


def test_bad_ids_inside_the_window_are_still_masked(model):
    first = engine(model, START).generate([PROMPTS[0]], SamplingParams(**GREEDY))[0]
    again = engine(model, START).generate([PROMPTS[0]], SamplingParams(**GREEDY, bad_token_ids=(first[0],)))[
        0
    ]
    assert again[0] != first[0]


def test_an_end_id_below_the_window_is_refused(model):
    with pytest.raises(ValueError, match="end_id 5 is not an id this engine outputs"):
        engine(model, START).add_request([1, 2], SamplingParams(**GREEDY, end_id=5))
    with pytest.raises(ValueError, match="output_tokens_from"):
        engine(model, VOCAB)


def test_the_first_id_from_a_token_of_the_checkpoints_tokenizer(tmp_path):
    vocab = {"a": 0, "b": 1, "<|s_0|>": 2}
    Tokenizer(models.WordLevel(vocab, unk_token="a")).save(str(tmp_path / "tokenizer.json"))
    assert output_token_id(tmp_path, "<|s_0|>") == 2
    assert output_token_id(tmp_path, "17") == 17
    assert output_token_id(tmp_path, "") == 0
    assert output_token_id(tmp_path, 5) == 5
    with pytest.raises(CheckpointError, match="has no such token"):
        output_token_id(tmp_path, "<|s_9|>")
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        output_token_id(tmp_path / "missing", "<|s_0|>")
