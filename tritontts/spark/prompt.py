"""Spark-TTS prompts as text, and the token ids the LLM reads and writes.

Upstream (`cli/SparkTTS.py:process_prompt` and the Triton runtime's `spark_tts/1/model.py:process_prompt`)
builds the same two prompts: with a reference transcript, the reference's semantic tokens follow
`<|start_semantic_token|>` and the model continues them; without one, the prompt ends after the global tokens.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

SEMANTIC_PATTERN = re.compile(r"<\|bicodec_semantic_(\d+)\|>")
GLOBAL_PATTERN = re.compile(r"<\|bicodec_global_(\d+)\|>")
GLOBAL_CODEBOOK = 4096
SEMANTIC_CODEBOOK = 8192
GLOBAL_TOKEN_COUNT = 32
"""BiCodec's speaker is 32 global tokens; a created voice's are the first 32 the LLM generates."""

TASK_TTS = "<|task_tts|>"
TASK_CONTROLLABLE_TTS = "<|task_controllable_tts|>"
START_CONTENT, END_CONTENT = "<|start_content|>", "<|end_content|>"
START_GLOBAL, END_GLOBAL = "<|start_global_token|>", "<|end_global_token|>"
START_SEMANTIC, END_SEMANTIC = "<|start_semantic_token|>", "<|end_semantic_token|>"
START_STYLE, END_STYLE = "<|start_style_label|>", "<|end_style_label|>"
LEVELS = ("very_low", "low", "moderate", "high", "very_high")
GENDERS = ("female", "male")


def global_tokens_text(global_tokens: Iterable[int]) -> str:
    return "".join(f"<|bicodec_global_{int(g)}|>" for g in global_tokens)


def semantic_tokens_text(semantic_tokens: Iterable[int]) -> str:
    return "".join(f"<|bicodec_semantic_{int(s)}|>" for s in semantic_tokens)


def build_global_only_prompt(target_text: str, global_tokens: Iterable[int]) -> str:
    """Upstream's prompt when no reference transcript is given: the speaker comes from the global tokens only."""
    return (
        f"{TASK_TTS}{START_CONTENT}{target_text}{END_CONTENT}"
        f"{START_GLOBAL}{global_tokens_text(global_tokens)}{END_GLOBAL}"
    )


def build_voice_clone_prompt(
    reference_text: str | None,
    target_text: str,
    global_tokens: Iterable[int],
    semantic_tokens: Iterable[int] | None = None,
) -> str:
    """Upstream's voice-cloning prompt, byte for byte.

    With `reference_text`, the reference's `semantic_tokens` are required and the prompt ends with
    `<|start_semantic_token|>` + those tokens (no end marker: the model continues speaking). With
    `reference_text=None` this is `build_global_only_prompt` and `semantic_tokens` is not used.
    """
    if reference_text is None:
        return build_global_only_prompt(target_text, global_tokens)
    if semantic_tokens is None:
        raise ValueError("a reference transcript needs the reference's semantic tokens")
    return (
        f"{TASK_TTS}{START_CONTENT}{reference_text}{target_text}{END_CONTENT}"
        f"{START_GLOBAL}{global_tokens_text(global_tokens)}{END_GLOBAL}"
        f"{START_SEMANTIC}{semantic_tokens_text(semantic_tokens)}"
    )


@dataclass(frozen=True)
class VoiceControl:
    """Spark-TTS voice creation: a voice from attributes instead of a reference audio."""

    gender: str
    pitch: str = "moderate"
    speed: str = "moderate"

    def __post_init__(self) -> None:
        if self.gender not in GENDERS:
            raise ValueError(f"gender must be one of {', '.join(GENDERS)}, got {self.gender!r}")
        for name in ("pitch", "speed"):
            if getattr(self, name) not in LEVELS:
                raise ValueError(f"{name} must be one of {', '.join(LEVELS)}, got {getattr(self, name)!r}")


def build_control_prompt(target_text: str, gender: str, pitch: str, speed: str) -> str:
    """Upstream's voice-creation prompt (`process_prompt_control`): the model invents the global tokens too."""
    VoiceControl(gender, pitch, speed)
    attributes = (
        f"<|gender_{GENDERS.index(gender)}|><|pitch_label_{LEVELS.index(pitch)}|>"
        f"<|speed_label_{LEVELS.index(speed)}|>"
    )
    return f"{TASK_CONTROLLABLE_TTS}{START_CONTENT}{target_text}{END_CONTENT}{START_STYLE}{attributes}{END_STYLE}"


def parse_semantic_tokens(text: str) -> list[int]:
    """Semantic ids in generated text, in order, as upstream's `bicodec_semantic_(\\d+)` regex finds them."""
    return [int(m) for m in SEMANTIC_PATTERN.findall(text)]


def parse_global_tokens(text: str) -> list[int]:
    return [int(m) for m in GLOBAL_PATTERN.findall(text)]


def load_llm_tokenizer(llm_dir: str | Path) -> Tokenizer:
    path = Path(llm_dir) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in {llm_dir}")
    return Tokenizer.from_file(str(path))


def read_eos_token(llm_dir: str | Path) -> str:
    """The `eos_token` that `LLM/tokenizer_config.json` declares (upstream stops generation at its id)."""
    config = json.loads((Path(llm_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not eos:
        raise ValueError(f"{llm_dir}/tokenizer_config.json declares no eos_token")
    return eos


def _contiguous_base(tokenizer: Tokenizer, template: str, count: int) -> int:
    base = tokenizer.token_to_id(template.format(0))
    if base is None:
        raise ValueError(f"tokenizer has no {template.format(0)}")
    for index in range(count):
        if tokenizer.token_to_id(template.format(index)) != base + index:
            raise ValueError(
                f"{template.format(index)} is not at id {base + index}: the range is not contiguous"
            )
    return base


def _require_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer has no {token}")
    return token_id


@dataclass(frozen=True)
class SparkTokenIds:
    """Ids of the Spark-TTS tokens in one tokenizer, looked up by name."""

    global_base: int
    semantic_base: int
    task_tts: int
    start_content: int
    end_content: int
    start_global: int
    end_global: int
    start_semantic: int
    end_semantic: int | None
    eos: int

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer, eos_token: str) -> SparkTokenIds:
        return cls(
            global_base=_contiguous_base(tokenizer, "<|bicodec_global_{}|>", GLOBAL_CODEBOOK),
            semantic_base=_contiguous_base(tokenizer, "<|bicodec_semantic_{}|>", SEMANTIC_CODEBOOK),
            task_tts=_require_id(tokenizer, TASK_TTS),
            start_content=_require_id(tokenizer, START_CONTENT),
            end_content=_require_id(tokenizer, END_CONTENT),
            start_global=_require_id(tokenizer, START_GLOBAL),
            end_global=_require_id(tokenizer, END_GLOBAL),
            start_semantic=_require_id(tokenizer, START_SEMANTIC),
            end_semantic=tokenizer.token_to_id(END_SEMANTIC),
            eos=_require_id(tokenizer, eos_token),
        )

    @classmethod
    def from_llm_dir(cls, llm_dir: str | Path) -> SparkTokenIds:
        return cls.from_tokenizer(load_llm_tokenizer(llm_dir), read_eos_token(llm_dir))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Upstream stops at the tokenizer's eos; `<|end_semantic_token|>` (emitted just before it) ends speech
        as well, and stopping there too changes no semantic id."""
        return (self.eos,) if self.end_semantic is None else (self.eos, self.end_semantic)

    def is_semantic(self, token_id: int) -> bool:
        return self.semantic_base <= token_id < self.semantic_base + SEMANTIC_CODEBOOK

    def semantic_ids(self, generated: Sequence[int]) -> list[int]:
        """Semantic codebook ids of the semantic tokens among `generated`, in order; everything else dropped.

        Same result as upstream's decode + regex, without decoding text."""
        base = self.semantic_base
        return [int(t) - base for t in generated if base <= int(t) < base + SEMANTIC_CODEBOOK]

    def global_ids(self, generated: Sequence[int]) -> list[int]:
        base = self.global_base
        return [int(t) - base for t in generated if base <= int(t) < base + GLOBAL_CODEBOOK]

    def semantic_token_id(self, semantic_id: int) -> int:
        return int(self.semantic_token_ids(np.array([semantic_id]))[0])

    def global_token_id(self, global_id: int) -> int:
        return int(self.global_token_ids(np.array([global_id]))[0])

    def semantic_token_ids(self, semantic_ids: np.ndarray) -> np.ndarray:
        """The vocabulary ids of semantic codebook ids, checked to lie in the codebook."""
        return _offset(semantic_ids, self.semantic_base, SEMANTIC_CODEBOOK, "semantic")

    def global_token_ids(self, global_ids: np.ndarray) -> np.ndarray:
        """The vocabulary ids of global codebook ids, checked to lie in the codebook."""
        return _offset(global_ids, self.global_base, GLOBAL_CODEBOOK, "global")


def _offset(ids: np.ndarray, base: int, codebook: int, kind: str) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= codebook):
        bad = ids[(ids < 0) | (ids >= codebook)][0]
        raise ValueError(f"{kind} id {bad} outside 0..{codebook - 1}")
    return ids + base
