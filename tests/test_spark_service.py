from pathlib import Path

import numpy as np
import pytest

from tritontts.spark.prompt import build_voice_clone_prompt, load_llm_tokenizer
from tritontts.spark.service import RequestLimits, SparkPrompter, VoiceTokens, check_request
from tritontts.synthetic.tokenizer import build_spark_tokenizer
from tritontts.triton.params import RequestError


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory) -> Path:
    return build_spark_tokenizer(tmp_path_factory.mktemp("llm"))


@pytest.mark.parametrize("reference_text", ["吃燕窝就选燕之屋。", ""])
def test_prompt_ids_equal_tokenizing_the_upstream_prompt_string(llm_dir, reference_text):
    rng = np.random.default_rng(0)
    voice = VoiceTokens(rng.integers(0, 4096, 32), rng.integers(0, 8192, 120))
    target = "Hello world, 身临其境，换新体验。"
    text = build_voice_clone_prompt(
        reference_text or None, target, voice.global_tokens, voice.semantic_tokens
    )
    expected = load_llm_tokenizer(llm_dir).encode(text, add_special_tokens=False).ids
    assert SparkPrompter(llm_dir).prompt_ids(reference_text, target, voice).tolist() == expected


def test_end_and_pad_ids_come_from_the_tokenizer_files(llm_dir):
    prompter = SparkPrompter(llm_dir)
    tokenizer = load_llm_tokenizer(llm_dir)
    assert prompter.end_id == tokenizer.token_to_id("<|im_end|>")
    assert prompter.pad_id == tokenizer.token_to_id("<|endoftext|>")


GOOD = dict(reference_wav=np.zeros(16000, np.float32) + 0.1, reference_text="ref", target_text="target")


@pytest.mark.parametrize(
    "change, field, words",
    [
        (dict(reference_wav=np.zeros(0, np.float32)), "reference_wav", "empty"),
        (dict(reference_wav=np.full(16000, np.nan, np.float32)), "reference_wav", "NaN"),
        (dict(reference_wav=np.zeros((2, 16000), np.float32)), "reference_wav", "mono"),
        (dict(reference_wav=np.zeros(800, np.float32)), "reference_wav", "at least"),
        (dict(reference_wav=np.zeros(16000 * 31, np.float32)), "reference_wav", "at most"),
        (dict(reference_wav=np.zeros(16000, np.int32)), "reference_wav", "float"),
        (dict(target_text="  "), "target_text", "empty"),
        (dict(target_text="x" * 1001), "target_text", "at most 1000"),
        (dict(reference_text="x" * 1001), "reference_text", "at most 1000"),
        (dict(target_text=b"bytes"), "target_text", "string"),
    ],
)
def test_bad_requests_name_the_field(change, field, words):
    with pytest.raises(RequestError) as err:
        check_request(**{**GOOD, **change}, limits=RequestLimits())
    assert err.value.field == field
    assert str(err.value).startswith(field) and words in str(err.value)


def test_good_request_passes():
    request = check_request(**GOOD, limits=RequestLimits())
    assert request.reference_wav.dtype == np.float32 and request.target_text == "target"


def test_token_budget_parameters():
    from tritontts.spark.service import TokenBudget, check_token_budget

    assert check_token_budget({}, 1500) is None
    assert check_token_budget({"max_new_tokens": 40}, 1500) == TokenBudget(0, 40)
    assert check_token_budget({"min_new_tokens": 40, "max_new_tokens": 40}, 1500) == TokenBudget(40, 40)
    for bad, field in [
        ({"max_new_tokens": 2000}, "max_new_tokens"),
        ({"min_new_tokens": "5"}, "min_new_tokens"),
        ({"min_new_tokens": 50, "max_new_tokens": 40}, "max_new_tokens"),
    ]:
        with pytest.raises(RequestError, match=field):
            check_token_budget(bad, 1500)
