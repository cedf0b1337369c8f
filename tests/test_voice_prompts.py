"""Each voice mode's LLM prompt against upstream's construction, text and ids.

The expected strings and id lists are built here the way upstream's own code builds them, read from its source:
SparkAudio/Spark-TTS `cli/SparkTTS.py:process_prompt_control` (the attribute tokens of
`sparktts/utils/token_parser.py`: female 0, male 1; very_low 0 .. very_high 4), tokenized by
`tokenizer([prompt])`; FunAudioLLM/CosyVoice `frontend_cross_lingual` / `frontend_instruct2`, whose texts go
through `CosyVoice2Tokenizer.encode` (`tokenizer([text])["input_ids"][0]`) one by one, and `Qwen2LM.inference`,
which lays out sos, prompt text, text, task_id and no speech tokens when prompt_speech_token is empty.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.spark.prompt import VoiceControl
from tritontts.spark.service import SparkPrompter, check_control
from tritontts.synthetic.cosyvoice2_llm import CHAT_TEMPLATE, LLM_SPECIAL, llm_added_tokens
from tritontts.synthetic.tokenizer import build_spark_tokenizer, write_qwen2_tokenizer
from tritontts.triton.params import RequestError

transformers = pytest.importorskip("transformers")
TARGET = "Hello world! 身临其境，换新体验。"
TAGGED = "在他讲述那个荒诞故事的过程中，他突然[laughter]停下来，因为他自己也被逗笑了[laughter]。<strong>好</strong>[breath]"
INSTRUCT = "用四川话说这句话<|endofprompt|>"
UPSTREAM_GENDER = {"female": 0, "male": 1}
UPSTREAM_LEVEL = {"very_low": 0, "low": 1, "moderate": 2, "high": 3, "very_high": 4}


@pytest.fixture(scope="module")
def spark_dir(tmp_path_factory) -> Path:
    return build_spark_tokenizer(tmp_path_factory.mktemp("spark_llm"))


@pytest.fixture(scope="module")
def cosy_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cosyvoice2_llm")
    return write_qwen2_tokenizer(out, llm_added_tokens(), LLM_SPECIAL, chat_template=CHAT_TEMPLATE)


def upstream_control_prompt(gender: str, pitch: str, speed: str, text: str) -> str:
    attributes = (
        f"<|gender_{UPSTREAM_GENDER[gender]}|>"
        f"<|pitch_label_{UPSTREAM_LEVEL[pitch]}|>"
        f"<|speed_label_{UPSTREAM_LEVEL[speed]}|>"
    )
    return (
        "<|task_controllable_tts|><|start_content|>" + text + "<|end_content|>"
        "<|start_style_label|>" + attributes + "<|end_style_label|>"
    )


@pytest.mark.parametrize(
    "gender,pitch,speed",
    [("female", "very_low", "very_high"), ("male", "moderate", "low"), ("male", "high", "moderate")],
)
def test_spark_voice_creation_prompt_is_upstreams(spark_dir, gender, pitch, speed):
    prompter = SparkPrompter(spark_dir)
    hf = transformers.AutoTokenizer.from_pretrained(str(spark_dir))
    expected = hf([upstream_control_prompt(gender, pitch, speed, TARGET)])["input_ids"][0]
    ids = prompter.control_prompt_ids(TARGET, VoiceControl(gender, pitch, speed)).tolist()
    assert ids == expected
    assert hf.decode(ids) == upstream_control_prompt(gender, pitch, speed, TARGET)


def test_spark_attribute_tokens_are_single_tokens(spark_dir):
    hf = transformers.AutoTokenizer.from_pretrained(str(spark_dir))
    tokens = ["<|task_controllable_tts|>", "<|start_style_label|>", "<|end_style_label|>"]
    tokens += [f"<|gender_{i}|>" for i in range(2)]
    tokens += [f"<|{family}_{i}|>" for family in ("pitch_label", "speed_label") for i in range(5)]
    for token in tokens:
        assert len(hf(token, add_special_tokens=False)["input_ids"]) == 1, token


def test_spark_control_inputs_are_checked():
    assert check_control(None, None, None) is None
    assert check_control("female", None, "high") == VoiceControl("female", "moderate", "high")
    for args, field in (
        (("robot", None, None), "gender"),
        ((None, "low", None), "gender"),
        (("male", "loud", None), "pitch"),
        (("male", None, "fast"), "speed"),
    ):
        with pytest.raises(RequestError) as error:
            check_control(*args)
        assert error.value.field == field


def upstream_cosyvoice2_ids(hf, prompt_text: str, text: str, prompt_speech: list[int]) -> list[int]:
    """Qwen2LM.inference's layout: sos, prompt_text tokens, text tokens, task_id, prompt speech tokens."""
    encode = lambda t: hf([t])["input_ids"][0]  # noqa: E731  (CosyVoice2Tokenizer.encode)
    sos, task_id = hf.convert_tokens_to_ids("<|sos|>"), hf.convert_tokens_to_ids("<|task_id|>")
    speech = [151663 + t for t in prompt_speech]
    return [sos, *(encode(prompt_text) if prompt_text else []), *encode(text), task_id, *speech]


@pytest.mark.parametrize("text", [TARGET, TAGGED])
def test_cosyvoice2_cross_lingual_prompt_is_upstreams(cosy_dir, text):
    hf = transformers.AutoTokenizer.from_pretrained(str(cosy_dir))
    prompt = CosyVoice2Prompt.from_llm_dir(cosy_dir)
    assert prompt.cross_lingual_ids(text) == upstream_cosyvoice2_ids(hf, "", text, [])


@pytest.mark.parametrize(
    "instruct,text",
    [
        (INSTRUCT, TARGET),
        ("You are a helpful assistant. 请用广东话表达。<|endofprompt|>", TAGGED),
        ("Speak slowly.", TARGET),
    ],
)
def test_cosyvoice2_instruct2_prompt_is_upstreams(cosy_dir, instruct, text):
    hf = transformers.AutoTokenizer.from_pretrained(str(cosy_dir))
    prompt = CosyVoice2Prompt.from_llm_dir(cosy_dir)
    assert prompt.instruct2_ids(instruct, text) == upstream_cosyvoice2_ids(hf, instruct, text, [])


def test_fine_grained_tags_pass_through_as_their_tokens(cosy_dir):
    hf = transformers.AutoTokenizer.from_pretrained(str(cosy_dir))
    ids = CosyVoice2Prompt.from_llm_dir(cosy_dir).cross_lingual_ids(TAGGED)
    for tag in ("[laughter]", "[breath]", "<strong>", "</strong>"):
        assert hf.convert_tokens_to_ids(tag) in ids, tag
    assert hf.convert_tokens_to_ids("<|endofprompt|>") in CosyVoice2Prompt.from_llm_dir(
        cosy_dir
    ).instruct2_ids(INSTRUCT, TARGET)
