"""CosyVoice3's LLM input and output in the HF layout (upstream's `cosyvoice3` BLS and convert_cosyvoice3_to_hf.py).

Input: `<|sos|>{system + reference_text}{target_text}<|task_id|>` (the converter's chat template around the user
turn), then the reference's speech tokens as `<|s_N|>` ids (N + speech_base); the model continues speaking.
The text must hold `<|endofprompt|>`: upstream's BLS prefixes `"You are a helpful assistant.<|endofprompt|>"`
to a reference text without one, so a reference text that has one carries its own system part (upstream's
instruct form: `"You are a helpful assistant. <instruction><|endofprompt|>"`; its cross-lingual and instruct2 forms
also leave the prompt speech tokens out of the LLM input). Output: speech ids until
`<|eos1|>`; the other reserved rows (6561..6760 but eos1) are dropped (upstream's LLM would stop on them,
upstream's BLS would feed them to the flow, whose embedding has 6561 rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, Decoding, check_speech_tokens
from tritontts.cosyvoice3.tokens import (
    END_OF_PROMPT,
    SOS_TOKEN,
    SPEECH_TOKEN_COUNT,
    SYSTEM_PROMPT,
    TASK_ID_TOKEN,
    CosyVoice3TokenIds,
)
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.prompt import load_llm_tokenizer

DEFAULT_SYSTEM = SYSTEM_PROMPT + END_OF_PROMPT


def with_system_prompt(reference_text: str) -> str:
    """Upstream's BLS: the default system part unless the text carries `<|endofprompt|>` itself."""
    return reference_text if END_OF_PROMPT in reference_text else DEFAULT_SYSTEM + reference_text


def instruct_text(instruction: str) -> str:
    """Upstream's instruct form (example.py): the instruction inside the system part."""
    return f"{SYSTEM_PROMPT} {instruction}{END_OF_PROMPT}"


def prompt_text(reference_text: str, target_text: str) -> str:
    return f"{SOS_TOKEN}{with_system_prompt(reference_text)}{target_text}{TASK_ID_TOKEN}"


class CosyVoice3Prompt:
    """Builds LLM input ids and reads flow tokens out of LLM output ids, with one tokenizer (the same interface
    as CosyVoice2Prompt, so CosyVoice2's service drives it)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids = CosyVoice3TokenIds.from_tokenizer(tokenizer)

    @classmethod
    def from_llm_dir(cls, llm_dir: str | Path) -> CosyVoice3Prompt:
        return cls(load_llm_tokenizer(llm_dir))

    def input_ids(
        self, reference_text: str, target_text: str, prompt_speech_tokens: Iterable[int]
    ) -> list[int]:
        speech = check_speech_tokens(prompt_speech_tokens)
        text_ids = self.tokenizer.encode(prompt_text(reference_text, target_text)).ids
        if self.ids.end_of_prompt not in text_ids:
            raise ValueError(f"the LLM prompt has no {END_OF_PROMPT}")
        return [*text_ids, *(self.ids.speech_base + t for t in speech)]

    def cross_lingual_ids(self, target_text: str) -> list[int]:
        """Upstream's cross-lingual form (frontend_cross_lingual): no reference text and no prompt speech tokens in
        the LLM (the flow keeps the reference's prompt); the system part starts the target text."""
        return self.input_ids("", target_text, [])

    def instruct_ids(self, instruction: str, target_text: str) -> list[int]:
        """Upstream's instruct2 form: the instruction in the system part, no prompt speech tokens in the LLM."""
        return self.input_ids(instruct_text(instruction), target_text, [])

    def speech_tokens(self, output_ids: Sequence[int]) -> list[int]:
        """The flow's tokens (0..6560); reserved speech rows are dropped, any other id is a ValueError."""
        base, reserved = self.ids.speech_base, set(self.ids.reserved)
        values = []
        for i, token_id in enumerate(int(t) for t in output_ids):
            if token_id in reserved:
                continue
            if not 0 <= token_id - base < SPEECH_TOKEN_COUNT:
                raise ValueError(f"LLM output: id {token_id} at position {i} is not a speech token")
            values.append(token_id - base)
        return values

    def sampling_params(self, decoding: Decoding = UPSTREAM_DECODING) -> SamplingParams:
        return SamplingParams(
            max_tokens=decoding.max_tokens,
            temperature=decoding.temperature,
            top_k=decoding.top_k,
            top_p=decoding.top_p,
            repetition_penalty=decoding.repetition_penalty,
            seed=decoding.seed,
            end_id=self.ids.end,
            pad_id=self.ids.end,
        )
