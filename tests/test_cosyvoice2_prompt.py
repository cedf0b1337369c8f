from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2 import tokens as cv
from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, CosyVoice2Prompt, check_speech_tokens, prompt_text
from tritontts.cosyvoice2.spk2info import CachedSpeaker, load_spk2info, save_spk2info
from tritontts.cosyvoice2.tokens import CosyVoice2TokenIds
from tritontts.synthetic.cosyvoice2_llm import CHAT_TEMPLATE, LLM_SPECIAL, llm_added_tokens
from tritontts.synthetic.tokenizer import build_spark_tokenizer, write_qwen2_tokenizer

REFERENCE = "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。"
TARGET = "Hello world! 身临其境，换新体验。"
END_ID = 158224


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cosyvoice2_llm")
    return write_qwen2_tokenizer(out, llm_added_tokens(), LLM_SPECIAL, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def prompt(llm_dir) -> CosyVoice2Prompt:
    return CosyVoice2Prompt.from_llm_dir(llm_dir)


def test_documented_constants():
    assert cv.ORIGINAL_VOCAB_SIZE == 151663 and cv.SPEECH_TOKEN_COUNT == 6561
    assert cv.TOKEN_COUNT == 158229 and cv.LLM_VOCAB_SIZE == 158336
    text = cv.text_added_tokens()
    assert text[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert text[3] == "<|endofprompt|>" and len(text) == cv.ORIGINAL_VOCAB_SIZE - 151643
    assert len(cv.llm_added_tokens()) == cv.TOKEN_COUNT - 151643


def test_token_ids_are_read_from_the_tokenizer(llm_dir, prompt):
    tokenizer = Tokenizer.from_file(str(llm_dir / "tokenizer.json"))
    assert tokenizer.token_to_id("<|endofprompt|>") == 151646
    assert tokenizer.token_to_id("<|s_0|>") == 151663
    assert tokenizer.token_to_id("<|s_6560|>") == 158223
    assert prompt.ids == CosyVoice2TokenIds(
        speech_base=151663, sos=158227, task_id=158228, end=END_ID, stops=(END_ID, 158225, 158226)
    )


def test_a_tokenizer_without_speech_tokens_is_refused(tmp_path):
    with pytest.raises(ValueError, match="<\\|s_0\\|>"):
        CosyVoice2TokenIds.from_tokenizer(
            Tokenizer.from_file(str(build_spark_tokenizer(tmp_path) / "tokenizer.json"))
        )


def test_input_ids_follow_the_upstream_template(prompt, llm_dir):
    speech = [0, 6560, 17]
    ids = prompt.input_ids(REFERENCE, TARGET, speech)
    assert ids[0] == prompt.ids.sos
    assert ids[-4] == prompt.ids.task_id
    assert ids[-3:] == [151663, 158223, 151680]
    assert all(i < cv.ORIGINAL_VOCAB_SIZE for i in ids[1:-4])
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(llm_dir))
    upstream = hf.encode(f"<|sos|>{REFERENCE}{TARGET}<|task_id|>") + [
        t + cv.ORIGINAL_VOCAB_SIZE for t in speech
    ]
    assert ids == upstream
    chat = hf.apply_chat_template([{"role": "user", "content": REFERENCE + TARGET}], tokenize=False)
    assert chat == prompt_text(REFERENCE, TARGET)


def test_prompt_speech_tokens_are_range_checked(prompt):
    for bad in ([-1], [6561], [3, 151663]):
        with pytest.raises(ValueError, match="prompt speech tokens"):
            prompt.input_ids(REFERENCE, TARGET, bad)
    assert check_speech_tokens(torch.tensor([0, 6560])) == [0, 6560]


def test_output_ids_convert_to_flow_tokens(prompt):
    assert prompt.speech_tokens([151663, 158223, 151663 + 42]) == [0, 6560, 42]
    assert prompt.speech_tokens([]) == []
    for bad in ([151663, END_ID + 1], [151662], [158226]):
        with pytest.raises(ValueError, match="not speech tokens"):
            prompt.speech_tokens(bad)


def test_sampling_params_are_what_the_bls_sends(prompt):
    params = prompt.sampling_params()
    assert (params.max_tokens, params.temperature, params.top_k, params.top_p) == (750, 0.8, 50, 0.95)
    assert (params.repetition_penalty, params.seed) == (1.1, 42)
    assert params.end_id == params.pad_id == END_ID
    assert UPSTREAM_DECODING.max_tokens == 750


def _speaker(tokens: int = 5) -> CachedSpeaker:
    return CachedSpeaker(
        prompt_text=REFERENCE,
        speech_token=torch.arange(tokens, dtype=torch.int32)[None],
        speech_feat=torch.randn(1, 2 * tokens, 80),
        embedding=torch.randn(1, 192),
        prompt_text_token=torch.tensor([[1, 2, 3]], dtype=torch.int32),
    )


def test_spk2info_round_trip(tmp_path):
    path = save_spk2info(tmp_path / "spk2info.pt", {"001": _speaker(), "002": _speaker(3)})
    raw = torch.load(path, weights_only=True)
    assert set(raw["001"]) == {
        "name",
        "spk_id",
        "prompt_text",
        "prompt_text_token",
        "speech_feat",
        "speech_token",
        "embedding",
    }
    assert raw["001"]["speech_token"].dtype == torch.int32 and raw["001"]["spk_id"] == "001"
    loaded = load_spk2info(path)
    assert sorted(loaded) == ["001", "002"]
    assert torch.equal(loaded["001"].speech_feat, raw["001"]["speech_feat"])
    assert loaded["002"].speech_token.shape == (1, 3)


def test_spk2info_errors_name_the_problem(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_spk2info(tmp_path / "missing.pt")
    entry = _speaker().to_dict("001")
    del entry["embedding"]
    torch.save({"001": entry}, tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="'001'.*missing keys: embedding"):
        load_spk2info(tmp_path / "a.pt")
    entry = _speaker().to_dict("001") | {"speech_feat": torch.zeros(1, 9, 80)}
    torch.save({"001": entry}, tmp_path / "b.pt")
    with pytest.raises(CheckpointError, match="speech_feat must be \\[1, 10, 80\\]"):
        load_spk2info(tmp_path / "b.pt")
    entry = _speaker().to_dict("001") | {"speech_token": torch.tensor([[6561]], dtype=torch.int32)}
    entry["speech_feat"] = torch.zeros(1, 2, 80)
    torch.save({"001": entry}, tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="speech_token: 1 value"):
        load_spk2info(tmp_path / "c.pt")


class _Custom:
    pass


def test_spk2info_with_arbitrary_objects_is_not_unpickled(tmp_path):
    path = tmp_path / "spk2info.pt"
    torch.save({"001": {"obj": _Custom()}}, path)
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_spk2info(path)
