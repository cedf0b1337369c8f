"""Synthetic LLMs end their speech at a length proportional to their text (tritontts.synthetic.length_counter).

The expected count is the counter's own rule (speech tokens = token rate x the text's spoken seconds, minus
the reference's speech tokens already in the prompt); "realistic" is checked against the benchmark's
independent estimate (tritontts.bench.durations) within a loose factor.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tritontts.bench.durations import expected_seconds
from tritontts.cosyvoice2 import tokens as cv
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.cosyvoice3.convert import convert_cosyvoice3_llm
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt
from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import SamplingParams
from tritontts.spark import tokens as layout
from tritontts.spark.prompt import build_voice_clone_prompt, load_llm_tokenizer
from tritontts.synthetic import length_counter as lc
from tritontts.synthetic.cosyvoice2_llm import (
    SPEECH_TOKEN_RATE,
    qwen2lm_state_dict,
    text_row_weights,
    write_cosyvoice2_llm,
)
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files
from tritontts.synthetic.spark import SEMANTIC_TOKEN_RATE, row_weights, write_spark_llm

SEEDS = range(3)
SHORT = "Hello there."
LONG = "The meeting has been moved to Thursday afternoon at three o'clock, please tell everyone."
ZH = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
SPARK_END = layout.token_ids()[layout.EOS_TOKEN]
CV2_END = cv.ORIGINAL_VOCAB_SIZE + cv.SPEECH_TOKEN_COUNT


def test_token_seconds_counts_letters_ideographs_and_pauses():
    assert lc.token_seconds(b"hello") == pytest.approx(5 * lc.LETTER_SECONDS)
    assert lc.token_seconds("好".encode()) == pytest.approx(lc.CJK_SECONDS)
    assert lc.token_seconds("，".encode()) == pytest.approx(lc.PAUSE_SECONDS)
    assert lc.token_seconds(b", ") == pytest.approx(lc.PAUSE_SECONDS)
    assert lc.token_seconds("好".encode()[1:]) == 0  # continuation bytes: counted with their lead byte
    assert lc.token_seconds(b" \n") == 0
    assert lc.token_seconds(("好" * 100).encode()) == lc.MAX_TOKEN_SECONDS


def test_embedding_rows_have_one_norm_and_carry_their_weight():
    counter = lc.LengthCounter(50)
    weights = torch.tensor([0.0, 1.0, 5.0, counter.max_weight])
    rows = lc.fixed_norm_rows(
        torch.randn(4, 64) * 0.05, weights, torch.tensor([0.2, 0.05, 0.05, 0.05]), counter
    )
    assert torch.allclose(rows.norm(dim=-1), torch.full((4,), lc.row_norm(64)))
    assert torch.allclose(rows[:, lc.TEXT_CHANNEL], lc.text_alpha(64, counter) * weights)
    assert bool((rows[:, lc.LENGTH_CHANNEL] == 0).all())


def _spark_prompt(llm_dir: Path, reference: str | None, target: str, reference_tokens: int) -> list[int]:
    gen = torch.Generator().manual_seed(1)
    globals_ = torch.randint(0, 4096, (32,), generator=gen).tolist()
    semantic = torch.randint(0, 8192, (reference_tokens,), generator=gen).tolist() if reference else None
    text = build_voice_clone_prompt(reference, target, globals_, semantic)
    return load_llm_tokenizer(llm_dir).encode(text, add_special_tokens=False).ids


def _spark_expected(prompt: list[int], reference_tokens: int) -> float:
    """Speech tokens the counter lets through after `prompt`: rate x text seconds, less those in the prompt."""
    weights = row_weights()[prompt]
    return float((weights - 1).clamp_min(0).sum()) - reference_tokens


@pytest.fixture(scope="module")
def spark_engine(tmp_path_factory) -> tuple[Path, LLMEngine]:
    llm_dir = write_spark_llm(tmp_path_factory.mktemp("LLM"), "tiny", seed=0)
    return llm_dir, LLMEngine.from_pretrained(llm_dir, "cpu", max_batch_size=3, max_seq_len=1024)


def _spark_params(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=900, temperature=0.8, top_k=50, top_p=0.95, seed=seed, end_id=SPARK_END)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reference", "target", "reference_tokens"), [(None, LONG, 0), ("参考文本。", ZH, 50), ("Hi.", SHORT, 20)]
)
def test_spark_tiny_ends_at_the_text_length(spark_engine, reference, target, reference_tokens):
    llm_dir, engine = spark_engine
    prompt = _spark_prompt(llm_dir, reference, target, reference_tokens)
    outputs = engine.generate([prompt] * len(SEEDS), [_spark_params(s) for s in SEEDS])
    expected = _spark_expected(prompt, reference_tokens)
    semantic = range(layout.SEMANTIC_BASE, layout.SEMANTIC_BASE + layout.SEMANTIC_COUNT)
    for out in outputs:
        assert len(out) < 900, "the end token never came"
        assert all(t in semantic for t in out)
        assert expected * 0.95 <= len(out) <= expected * 1.1 + 5
    assert len({tuple(out) for out in outputs}) == len(SEEDS), "sampling must stay stochastic"
    if reference is None:  # no reference estimate to be off: realistic against the benchmark's own estimate
        realistic = expected_seconds(target) * SEMANTIC_TOKEN_RATE
        assert realistic / 1.6 <= len(outputs[0]) <= realistic * 1.6


@pytest.mark.slow
def test_spark_tiny_longer_text_speaks_longer(spark_engine):
    llm_dir, engine = spark_engine
    prompts = [_spark_prompt(llm_dir, None, text, 0) for text in (SHORT, LONG, LONG + " " + LONG)]
    lengths = [len(out) for out in engine.generate(prompts, [_spark_params(0)] * 3)]
    assert lengths[0] < lengths[1] < lengths[2]
    assert lengths[2] == pytest.approx(2 * lengths[1], rel=0.15)


@pytest.fixture(scope="module")
def cosyvoice2_llm(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cv2") / "cosyvoice2_llm"
    return write_cosyvoice2_llm(out, "tiny", qwen2lm_state_dict("tiny", 0), 0)


@pytest.mark.slow
@pytest.mark.parametrize(("reference", "target"), [("Please call Stella.", LONG), ("参考文本。", ZH)])
def test_cosyvoice2_tiny_ends_at_the_text_length(cosyvoice2_llm, reference, target):
    _check_cosyvoice_tiny(cosyvoice2_llm, CosyVoice2Prompt.from_llm_dir(cosyvoice2_llm), reference, target)


@pytest.fixture(scope="module")
def cosyvoice3_llm(tmp_path_factory) -> Path:
    return _cosyvoice3_llm(tmp_path_factory.mktemp("cv3"), "tiny", "float32")


@pytest.mark.slow
@pytest.mark.parametrize(("reference", "target"), [("Please call Stella.", LONG), ("参考文本。", ZH)])
def test_cosyvoice3_tiny_ends_at_the_text_length(cosyvoice3_llm, reference, target):
    """The served HF layout (converted from llm.pt), with upstream's default system prompt in the text."""
    _check_cosyvoice_tiny(cosyvoice3_llm, CosyVoice3Prompt.from_llm_dir(cosyvoice3_llm), reference, target)


def _cosyvoice3_llm(root: Path, preset: str, dtype: str) -> Path:
    """llm.pt + BlankEN from the synthetic writer, converted to the HF layout the runtime serves."""
    model_dir = write_cosyvoice3_llm_files(write_cosyvoice3_token2wav(root / "model", "tiny", 0), preset, 0)
    convert_cosyvoice3_llm(model_dir, root / "hf_cosyvoice3_llm", dtype)
    return root / "hf_cosyvoice3_llm"


def _text_tokens(ids: list[int]) -> float:
    """Speech tokens the counter allots to the text ids of a CosyVoice2 or CosyVoice3 prompt (Qwen2's text ids)."""
    weights = text_row_weights()
    return sum(float(weights[i] - 1) for i in ids if i < cv.QWEN2_VOCAB_SIZE)


def _check_cosyvoice_tiny(
    llm_dir: Path, prompt: CosyVoice2Prompt | CosyVoice3Prompt, reference: str, target: str
) -> None:
    """With 30 reference speech tokens in the prompt, each seed's speech ends within -5%..+10% (+3) of the
    counted length, all of it speech tokens, the seeds differ, and the length is realistic for the texts."""
    reference_speech = torch.randint(
        0, cv.SPEECH_TOKEN_COUNT, (30,), generator=torch.Generator().manual_seed(0)
    )
    ids = prompt.input_ids(reference, target, reference_speech.tolist())
    expected = _text_tokens(ids) - 30
    engine = LLMEngine.from_pretrained(llm_dir, "cpu", max_batch_size=3, max_seq_len=1024)
    params = [replace(prompt.sampling_params(), max_tokens=600, seed=s) for s in SEEDS]
    outputs = engine.generate([ids] * len(SEEDS), params)
    for out in outputs:
        speech = prompt.speech_tokens(out)
        assert len(out) < 600, "the end token never came"
        assert len(speech) == len(out), "a reserved speech row came before the end token"
        assert all(0 <= t < cv.SPEECH_TOKEN_COUNT for t in speech)
        assert expected * 0.95 <= len(speech) <= expected * 1.1 + 3
    assert len({tuple(out) for out in outputs}) == len(SEEDS)
    realistic = (expected_seconds(reference) + expected_seconds(target)) * SPEECH_TOKEN_RATE - 30
    assert realistic / 1.6 <= len(outputs[0]) <= realistic * 1.6


def _end_probability(
    model: torch.nn.Module, prompt: list[int], speech: torch.Tensor, end: int
) -> torch.Tensor:
    """P(end) after each speech token appended to `prompt` (temperature 0.8), teacher-forced."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + speech.tolist()])).logits[0, len(prompt) - 1 :]
    return (logits.float() / 0.8).softmax(-1)[:, end]


def _check_full_preset(
    llm_dir: Path, ids: list[int], expected: float, vocab: int, base: int, end: int
) -> None:
    """The full preset (24 layers, 896 wide) in bf16, as GPUs run it, teacher-forced with random speech ids
    `base + 0..vocab-1`: P(end) stays negligible until 95% of the counted length, and passes 0.5 before 110%."""
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM.from_pretrained(str(llm_dir), dtype=torch.bfloat16).eval()
    tail = torch.randint(0, vocab, (int(expected * 1.1),), generator=torch.Generator())
    p_end = _end_probability(model, ids, tail + base, end)
    assert float(p_end[: int(expected * 0.95)].max()) < 1e-3
    assert float(p_end[int(expected * 0.95) :].max()) > 0.5


@pytest.mark.slow
def test_spark_full_preset_ends_at_the_text_length(tmp_path):
    llm_dir = write_spark_llm(tmp_path / "LLM", "full", seed=0, dtype=torch.bfloat16)
    prompt = _spark_prompt(llm_dir, None, LONG, 0)
    _check_full_preset(
        llm_dir, prompt, _spark_expected(prompt, 0), layout.SEMANTIC_COUNT, layout.SEMANTIC_BASE, SPARK_END
    )


@pytest.mark.slow
def test_cosyvoice2_full_preset_ends_at_the_text_length(tmp_path):
    llm_dir = write_cosyvoice2_llm(tmp_path / "cosyvoice2_llm", "full", qwen2lm_state_dict("full", 0), 0)
    ids = CosyVoice2Prompt.from_llm_dir(llm_dir).input_ids("参考文本。", ZH, [])
    _check_full_preset(
        llm_dir, ids, _text_tokens(ids), cv.SPEECH_TOKEN_COUNT, cv.ORIGINAL_VOCAB_SIZE, CV2_END
    )


@pytest.mark.slow
def test_cosyvoice3_full_preset_ends_at_the_text_length(tmp_path):
    llm_dir = _cosyvoice3_llm(tmp_path, "full", "bfloat16")
    prompt = CosyVoice3Prompt.from_llm_dir(llm_dir)
    ids = prompt.input_ids("参考文本。", ZH, [])
    _check_full_preset(
        llm_dir, ids, _text_tokens(ids), cv.SPEECH_TOKEN_COUNT, prompt.ids.speech_base, prompt.ids.end
    )
