"""CosyVoice2's LLM prompt as every backend takes it (ids for the in-process ones, texts and speech tokens for a
chat endpoint), the room it needs, and upstream's sampling. Shared by `offline_cosyvoice2` and `offline_openai`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_llm import Generate
from tritontts.bench.offline_settings import Decoding
from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, CosyVoice2Prompt

TOKEN_RATE = 25


@dataclass(frozen=True)
class SpeechPrompt:
    """One row's LLM input: ids for the in-process backends, texts and speech tokens for a chat endpoint."""

    reference_text: str
    target_text: str
    speech_tokens: np.ndarray
    """int32 [n], the reference's speech tokens 0..6560"""
    ids: np.ndarray
    """int32 LLM input ids (the prompt text, then the speech tokens)"""


# Prompts and per prompt the forced token count (or None) in; per prompt the generated LLM ids out.
SpeechGenerate = Callable[[list[SpeechPrompt], list[int | None]], list[list[int]]]


def id_backend(generate: Generate) -> SpeechGenerate:
    """An in-process backend, fed each prompt's ids."""

    def run(prompts: list[SpeechPrompt], forced: list[int | None]) -> list[list[int]]:
        return generate([p.ids for p in prompts], forced)

    return run


def decoding_of(prompter: CosyVoice2Prompt) -> Decoding:
    """Upstream's sampling (T 0.8, top-k 50, top-p 0.95, repetition penalty 1.1), ending and padding at
    `<|eos1|>`."""
    d = UPSTREAM_DECODING
    return Decoding(
        end_id=prompter.ids.end,
        pad_id=prompter.ids.end,
        output_tokens_from="<|s_0|>",
        temperature=d.temperature,
        top_k=d.top_k,
        top_p=d.top_p,
        repetition_penalty=d.repetition_penalty,
    )


def plan_max_seq_len(rows: Sequence[Utterance], prompter: CosyVoice2Prompt, max_new_tokens: int) -> int:
    """Room for the longest prompt (its text, 25 speech tokens per second of reference, some slack) plus the
    generated tokens, rounded up to 256."""
    longest = 0
    for u in rows:
        text = len(prompter.tokenizer.encode(u.prompt_text + u.target_text).ids)
        reference = len(u.prompt_audio) * TOKEN_RATE // u.sample_rate + 2
        longest = max(longest, text + reference + 8)
    return -(-(longest + max_new_tokens) // 256) * 256
