"""Where each token sits in the vocabulary of Spark-TTS-0.5B's `LLM/tokenizer.json`.

Only the synthetic checkpoint writer and the tests use these numbers; runtime code looks tokens up by name.
Provenance per group: `verified` (seen in public code that reads the real tokenizer, or Qwen2.5's published
tokenizer files) or `assumed` (placed here deterministically; the real id is unknown).
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB_SIZE = 166_000
BPE_VOCAB_SIZE = 151_643

# verified: Qwen2.5's added tokens, in id order from 151643.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
QWEN_SPECIAL_BASE = 151_643

# verified: the two audio-token families are contiguous.
GLOBAL_BASE = 151_665
GLOBAL_COUNT = 4096
SEMANTIC_BASE = 155_761
SEMANTIC_COUNT = 8192

# verified: markers whose ids a public port reads from the real tokenizer.json.
VERIFIED_MARKERS = {
    "<|task_tts|>": 165_137,
    "<|task_controllable_tts|>": 165_143,
    "<|start_content|>": 165_146,
    "<|start_global_token|>": 165_150,
    "<|start_semantic_token|>": 165_151,
    "<|end_content|>": 165_152,
    "<|end_style_label|>": 165_153,
    "<|end_global_token|>": 165_156,
}

# assumed: the other task tokens fill 165137..165146 around the verified ones.
ASSUMED_TASK_TOKENS = {
    "<|task_vc|>": 165_138,
    "<|task_asr|>": 165_139,
    "<|task_s2s|>": 165_140,
    "<|task_t2s|>": 165_141,
    "<|task_understand|>": 165_142,
    "<|task_cap|>": 165_144,
    "<|task_prompt_tts|>": 165_145,
}

# assumed: the remaining markers fill the gaps up to 165157.
ASSUMED_MARKERS = {
    "<|task_edit|>": 165_147,
    "<|start_style_label|>": 165_148,
    "<|start_acoustic_token|>": 165_149,
    "<|end_acoustic_token|>": 165_154,
    "<|end_task|>": 165_155,
    "<|end_semantic_token|>": 165_157,
}

# assumed: attribute tokens (token_parser.py) from 163953 in this order, then reserved fillers up to 165136.
ATTRIBUTE_BASE = SEMANTIC_BASE + SEMANTIC_COUNT
ATTRIBUTE_FAMILIES = (
    ("age", 5),
    ("gender", 2),
    ("pitch_value", 1001),
    ("pitch_label", 5),
    ("pitch_var_value", 11),
    ("pitch_var_label", 5),
    ("loudness_value", 31),
    ("loudness_label", 5),
    ("speed_value", 11),
    ("speed_label", 5),
    ("emotion", 25),
)
LAST_TOKEN_ID = 165_157

# assumed: the LLM's end of sequence and padding tokens (Qwen2.5-Instruct's choice).
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
# the first token the served LLM may output (run.sh --llm_output_tokens_from auto): markers and BiCodec tokens follow
OUTPUT_WINDOW_FROM = PAD_TOKEN


def global_token(index: int) -> str:
    return f"<|bicodec_global_{index}|>"


def semantic_token(index: int) -> str:
    return f"<|bicodec_semantic_{index}|>"


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool


def spark_added_tokens() -> list[AddedToken]:
    """Every added token of the tokenizer, ids ascending and gap-free from 151643 to LAST_TOKEN_ID."""
    tokens = [AddedToken(QWEN_SPECIAL_BASE + i, t, True) for i, t in enumerate(QWEN_SPECIAL_TOKENS)]
    tokens += [AddedToken(GLOBAL_BASE + i, global_token(i), False) for i in range(GLOBAL_COUNT)]
    tokens += [AddedToken(SEMANTIC_BASE + i, semantic_token(i), False) for i in range(SEMANTIC_COUNT)]
    attributes = [f"<|{name}_{i}|>" for name, count in ATTRIBUTE_FAMILIES for i in range(count)]
    markers = {**VERIFIED_MARKERS, **ASSUMED_TASK_TOKENS, **ASSUMED_MARKERS}
    first_marker = min(markers.values())
    reserved = first_marker - ATTRIBUTE_BASE - len(attributes)
    attributes += [f"<|spark_reserved_{i}|>" for i in range(reserved)]
    tokens += [AddedToken(ATTRIBUTE_BASE + i, t, False) for i, t in enumerate(attributes)]
    tokens += [AddedToken(i, t, False) for t, i in sorted(markers.items(), key=lambda kv: kv[1])]
    ids = [t.id for t in tokens]
    assert ids == list(range(QWEN_SPECIAL_BASE, LAST_TOKEN_ID + 1)), "token layout has gaps or overlaps"
    return tokens


def token_ids() -> dict[str, int]:
    """Token string -> id for every added token."""
    return {t.content: t.id for t in spark_added_tokens()}
