"""CosyVoice3 LLM: the HF conversion of llm.pt + CosyVoice-BlankEN, the prompt layout, parity with upstream.

`data/cosyvoice3_golden.npz` holds upstream's CosyVoice3LM (built from our cosyvoice3.yaml around our synthetic
BlankEN, our llm.pt loaded strictly, fp32) on one prompt: the text ids its CosyVoice3Tokenizer gives and the
first decoding step's `llm_decoder` logits (see data/cosyvoice3_make_golden.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from tolerance import max_error, within

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice3 import tokens as cv3
from tritontts.cosyvoice3.convert import CHAT_TEMPLATE, METADATA_FILE, convert_cosyvoice3_llm
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt, instruct_text, prompt_text, system_part
from tritontts.llm.engine import LLMEngine
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files

GOLDEN = np.load(Path(__file__).parent / "data" / "cosyvoice3_golden.npz")
REFERENCE_TEXT = "You are a helpful assistant.<|endofprompt|>Hello there, [breath] nice to meet you."
TARGET_TEXT = " 八百标兵奔北坡 [laughter] ok"
LOGITS_BOUND = 2e-4  # logits of ~10 through 2 fp32 layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cosy3_llm")
    # without the length counter: the weights the golden's upstream logits were computed from
    model_dir = write_cosyvoice3_token2wav(root / "model", "tiny", 0)
    return write_cosyvoice3_llm_files(model_dir, "tiny", 0, length_counter=False)


@pytest.fixture(scope="module")
def hf_dir(model_dir: Path) -> Path:
    convert_cosyvoice3_llm(model_dir, model_dir.parent / "hf_fp32", "float32")
    return model_dir.parent / "hf_fp32"


@pytest.fixture(scope="module")
def prompter(hf_dir: Path) -> CosyVoice3Prompt:
    return CosyVoice3Prompt.from_llm_dir(hf_dir)


def test_layout_matches_upstreams_converter(hf_dir: Path, prompter: CosyVoice3Prompt) -> None:
    metadata = json.loads((hf_dir / METADATA_FILE).read_text())
    assert metadata["original_vocab_size"] == 151646
    assert metadata["speech_token_offset"] == metadata["text_vocab_size"] == cv3.TEXT_VOCAB_SIZE == 151924
    assert metadata["padded_vocab_size"] == cv3.LLM_VOCAB_SIZE == 158720
    assert metadata["eos_token_id"] == prompter.ids.end == 151924 + 6562
    config = json.loads((hf_dir / "config.json").read_text())
    assert (config["vocab_size"], config["tie_word_embeddings"], config["eos_token_id"]) == (
        158720,
        False,
        158486,
    )
    assert prompter.ids.end_of_prompt == cv3.END_OF_PROMPT_ID
    assert prompter.tokenizer.token_to_id("<|s_6565|>") == 151924 + 6565
    assert json.loads((hf_dir / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


def test_prompt_ids_match_upstreams_tokenizer(prompter: CosyVoice3Prompt) -> None:
    speech = GOLDEN["llm_prompt_speech"].tolist()
    ids = prompter.input_ids(REFERENCE_TEXT, TARGET_TEXT, speech)
    expected = [prompter.ids.sos, *GOLDEN["llm_text_ids"].tolist(), prompter.ids.task_id]
    assert ids == expected + [prompter.ids.speech_base + s for s in speech]


@pytest.mark.golden
def test_first_step_logits_match_upstreams_cosyvoice3lm(hf_dir: Path, prompter: CosyVoice3Prompt) -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = prompter.input_ids(REFERENCE_TEXT, TARGET_TEXT, GOLDEN["llm_prompt_speech"].tolist())
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0, -1]
    base = prompter.ids.speech_base
    within(
        "llm logits", max_error(logits[base : base + cv3.SPEECH_VOCAB], GOLDEN["llm_logits"]), LOGITS_BOUND
    )


def test_our_engine_serves_the_converted_model(hf_dir: Path, prompter: CosyVoice3Prompt) -> None:
    engine = LLMEngine.from_pretrained(
        hf_dir, device="cpu", dtype=torch.float32, max_batch_size=2, cuda_graphs=False
    )
    params = replace(prompter.sampling_params(), max_tokens=40)
    prompts = [prompter.input_ids(REFERENCE_TEXT, f" sentence {i}", list(range(i, i + 30))) for i in range(2)]
    for output in engine.generate(prompts, params):
        assert output, "no token before <|eos1|>"
        assert prompter.speech_tokens(output) == [t - prompter.ids.speech_base for t in output]


def test_system_prompt_forms() -> None:
    assert (
        prompt_text("hi", " there") == "<|sos|>You are a helpful assistant.<|endofprompt|>hi there<|task_id|>"
    )
    instruct = instruct_text("请用广东话表达。")
    assert instruct == "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
    assert prompt_text(instruct, "x") == f"<|sos|>{instruct}x<|task_id|>"


# Upstream's voice-mode forms (example.py's cosyvoice3_example), laid out as CosyVoice3LM.inference does: sos, the
# prompt text's ids (instruct2: the instruction; cross-lingual: none), the text's ids, task_id, no speech tokens;
# each text through CosyVoice3Tokenizer.encode (`tokenizer([text])["input_ids"][0]`), one by one.
UPSTREAM_CROSS_LINGUAL = (
    "You are a helpful assistant.<|endofprompt|>[breath]因为他们那一辈人[breath]在乡里面住的要习惯一点。"
)
UPSTREAM_INSTRUCT = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"
UPSTREAM_INSTRUCT_TEXT = "好少咯，一般系放嗰啲国庆啊，中秋嗰啲可能会咯。"


def upstream_ids(hf, prompter: CosyVoice3Prompt, prompt_text_: str, text: str) -> list[int]:
    encode = lambda t: hf([t])["input_ids"][0]  # noqa: E731  (CosyVoice3Tokenizer.encode)
    ids = [*(encode(prompt_text_) if prompt_text_ else []), *encode(text)]
    assert cv3.END_OF_PROMPT_ID in ids  # CosyVoice3LM.inference's assertion
    return [prompter.ids.sos, *ids, prompter.ids.task_id]


@pytest.fixture(scope="module")
def hf_tokenizer(hf_dir: Path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(hf_dir))


@pytest.mark.parametrize(
    "target,upstream_text",
    [
        (UPSTREAM_CROSS_LINGUAL, UPSTREAM_CROSS_LINGUAL),  # written in upstream's form: taken as written
        ("Hello.", "You are a helpful assistant.<|endofprompt|>Hello."),  # the default system part
    ],
)
def test_cross_lingual_ids_are_upstreams(
    hf_tokenizer, prompter: CosyVoice3Prompt, target, upstream_text
) -> None:
    ids = prompter.cross_lingual_ids(target)
    assert ids == upstream_ids(hf_tokenizer, prompter, "", upstream_text)
    assert not any(prompter.ids.is_speech(t) for t in ids)
    assert prompt_text("", target) == f"<|sos|>{upstream_text}<|task_id|>"


@pytest.mark.parametrize(
    "instruction",
    [
        UPSTREAM_INSTRUCT,
        "请用广东话表达。",
        "请用广东话表达。<|endofprompt|>",
    ],  # upstream's, bare, CosyVoice2's
)
def test_instruct2_ids_are_upstreams(hf_tokenizer, prompter: CosyVoice3Prompt, instruction) -> None:
    assert instruct_text(instruction) == UPSTREAM_INSTRUCT
    ids = prompter.instruct2_ids(instruction, UPSTREAM_INSTRUCT_TEXT)
    assert ids == upstream_ids(hf_tokenizer, prompter, UPSTREAM_INSTRUCT, UPSTREAM_INSTRUCT_TEXT)
    assert ids[-1] == prompter.ids.task_id and not any(prompter.ids.is_speech(t) for t in ids)


def test_chat_user_turn_of_each_mode(prompter: CosyVoice3Prompt) -> None:
    """The text the chat server gets (upstream's BLS: user turn = system part + reference text + target) tokenizes
    to the same ids as our in-Triton prompt in each mode."""
    encode = prompter.tokenizer.encode
    for prefix, target, ids in (
        ("", "Hello.", prompter.cross_lingual_ids("Hello.")),
        ("", UPSTREAM_CROSS_LINGUAL, prompter.cross_lingual_ids(UPSTREAM_CROSS_LINGUAL)),
        (
            UPSTREAM_INSTRUCT,
            UPSTREAM_INSTRUCT_TEXT,
            prompter.instruct2_ids(UPSTREAM_INSTRUCT, UPSTREAM_INSTRUCT_TEXT),
        ),
    ):
        user = system_part(prefix, target) + target
        assert encode(f"<|sos|>{user}<|task_id|>").ids == ids


def test_reserved_rows_are_dropped_other_ids_refused(prompter: CosyVoice3Prompt) -> None:
    base = prompter.ids.speech_base
    assert prompter.speech_tokens([base + 5, base + 6565, base + 6560]) == [5, 6560]
    with pytest.raises(ValueError, match="id 100 at position 1 is not a speech token"):
        prompter.speech_tokens([base, 100])
    with pytest.raises(ValueError, match="prompt speech tokens: 1 value"):
        prompter.input_ids("a", "b", [6561])


def test_converter_refuses_a_cosyvoice2_llm_pt(model_dir: Path, tmp_path: Path) -> None:
    state = torch.load(model_dir / "llm.pt", weights_only=True)
    state["llm_decoder.bias"] = torch.zeros(cv3.SPEECH_VOCAB)
    torch.save(state, model_dir / "llm.pt")
    try:
        with pytest.raises(CheckpointError, match=r"unexpected keys \['llm_decoder.bias'\]"):
            convert_cosyvoice3_llm(model_dir, tmp_path / "out")
    finally:
        del state["llm_decoder.bias"]
        torch.save(state, model_dir / "llm.pt")
