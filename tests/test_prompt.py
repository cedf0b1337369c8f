import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models

from tritontts.spark import tokens as layout
from tritontts.spark.prompt import (
    SparkTokenIds,
    build_control_prompt,
    build_global_only_prompt,
    build_voice_clone_prompt,
    load_llm_tokenizer,
    parse_semantic_tokens,
    read_eos_token,
)
from tritontts.synthetic.tokenizer import build_spark_tokenizer

REFERENCE = "吃燕窝就选燕之屋。"
TARGET = "Hello, world!"


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory) -> Path:
    return build_spark_tokenizer(tmp_path_factory.mktemp("llm"))


def test_voice_clone_prompt_matches_upstream_bytes():
    prompt = build_voice_clone_prompt(REFERENCE, TARGET, [5, 4095, 0], [12, 8191])
    expected = (
        "<|task_tts|><|start_content|>吃燕窝就选燕之屋。Hello, world!<|end_content|>"
        "<|start_global_token|><|bicodec_global_5|><|bicodec_global_4095|><|bicodec_global_0|>"
        "<|end_global_token|><|start_semantic_token|><|bicodec_semantic_12|><|bicodec_semantic_8191|>"
    )
    assert prompt == expected


def test_prompt_without_reference_text_has_no_semantic_part():
    expected = (
        "<|task_tts|><|start_content|>Hello, world!<|end_content|>"
        "<|start_global_token|><|bicodec_global_7|><|end_global_token|>"
    )
    assert build_global_only_prompt(TARGET, [7]) == expected
    assert build_voice_clone_prompt(None, TARGET, [7], [1, 2]) == expected
    with pytest.raises(ValueError):
        build_voice_clone_prompt(REFERENCE, TARGET, [7])


def test_control_prompt_matches_upstream_bytes():
    expected = (
        "<|task_controllable_tts|><|start_content|>Hi<|end_content|>"
        "<|start_style_label|><|gender_1|><|pitch_label_0|><|speed_label_4|><|end_style_label|>"
    )
    assert build_control_prompt("Hi", "male", "very_low", "very_high") == expected


def test_parse_semantic_tokens():
    text = "<|bicodec_semantic_3|>x<|bicodec_global_9|><|bicodec_semantic_8191|><|end_semantic_token|>"
    assert parse_semantic_tokens(text) == [3, 8191]


def test_token_ids_from_tokenizer(llm_dir):
    ids = SparkTokenIds.from_llm_dir(llm_dir)
    assert ids.global_base == layout.GLOBAL_BASE
    assert ids.semantic_base == layout.SEMANTIC_BASE
    assert ids.task_tts == 165137 and ids.start_semantic == 165151 and ids.end_global == 165156
    assert read_eos_token(llm_dir) == layout.EOS_TOKEN
    assert ids.eos in ids.stop_ids and ids.end_semantic in ids.stop_ids


def test_prompt_ids_and_semantic_mapping(llm_dir):
    tokenizer = load_llm_tokenizer(llm_dir)
    ids = SparkTokenIds.from_llm_dir(llm_dir)
    prompt = build_voice_clone_prompt(REFERENCE, TARGET, list(range(32)), [10, 20])
    encoded = tokenizer.encode(prompt).ids
    assert encoded[:2] == [ids.task_tts, ids.start_content]
    assert encoded[-3:] == [ids.start_semantic, ids.semantic_token_id(10), ids.semantic_token_id(20)]
    assert ids.global_ids(encoded) == list(range(32))
    generated = [ids.semantic_token_id(7), 13, ids.semantic_token_id(8191), ids.end_semantic, ids.eos]
    text = tokenizer.decode(generated, skip_special_tokens=True)
    assert ids.semantic_ids(generated) == parse_semantic_tokens(text) == [7, 8191]


def test_token_ids_of_arrays_and_of_one_id(llm_dir):
    ids = SparkTokenIds.from_llm_dir(llm_dir)
    semantic, globals_ = np.array([0, 7, 8191], dtype=np.int32), np.array([0, 4095], dtype=np.int32)
    assert ids.semantic_token_ids(semantic).tolist() == [layout.SEMANTIC_BASE + s for s in (0, 7, 8191)]
    assert ids.global_token_ids(globals_).tolist() == [layout.GLOBAL_BASE, layout.GLOBAL_BASE + 4095]
    assert (
        ids.semantic_token_id(7) == layout.SEMANTIC_BASE + 7 and ids.global_token_id(0) == layout.GLOBAL_BASE
    )
    with pytest.raises(ValueError, match="semantic id 8192 outside 0..8191"):
        ids.semantic_token_id(8192)
    with pytest.raises(ValueError, match="semantic id 8192 outside 0..8191"):
        ids.semantic_token_ids(np.array([3, 8192]))
    with pytest.raises(ValueError, match="global id -1 outside 0..4095"):
        ids.global_token_ids(np.array([-1]))


def _word_level(semantic_gap_at: int | None) -> Tokenizer:
    names = ["<unk>", *(layout.global_token(i) for i in range(4096))]
    names += [layout.semantic_token(i) for i in range(8192) if i != semantic_gap_at]
    if semantic_gap_at is not None:
        names.append(layout.semantic_token(semantic_gap_at))
    names += ["<|task_tts|>", "<|start_content|>", "<|end_content|>", "<|start_global_token|>"]
    names += ["<|end_global_token|>", "<|start_semantic_token|>", "<|im_end|>"]
    return Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))


def test_ranges_are_looked_up_by_name_and_must_be_contiguous():
    ids = SparkTokenIds.from_tokenizer(_word_level(None), "<|im_end|>")
    assert (ids.global_base, ids.semantic_base, ids.end_semantic) == (1, 4097, None)
    assert ids.stop_ids == (ids.eos,)
    with pytest.raises(ValueError, match="not contiguous"):
        SparkTokenIds.from_tokenizer(_word_level(100), "<|im_end|>")
    with pytest.raises(ValueError, match=re.escape("no <|no_such_token|>")):
        SparkTokenIds.from_tokenizer(_word_level(None), "<|no_such_token|>")
