"""CosyVoice3's LLM input and output in the HF layout (upstream's `cosyvoice3` BLS and convert_cosyvoice3_to_hf.py).

Input: `<|sos|>{system + reference_text}{target_text}<|task_id|>` (the converter's chat template around the user
turn), then the reference's speech tokens as `<|s_N|>` ids (N + speech_base); the model continues speaking.
The text must hold `<|endofprompt|>`: upstream's BLS prefixes `"You are a helpful assistant.<|endofprompt|>"`
to a reference text without one, so a reference text that has one carries its own system part.
Voice modes (upstream's `frontend_cross_lingual` / `frontend_instruct2` with CosyVoice3's forms of example.py) leave
the prompt speech tokens out of the LLM input: cross-lingual is `<|sos|>` + the system part and the target text
(written as one text, `"You are a helpful assistant.<|endofprompt|>..."`) + `<|task_id|>`; instruct2 is `<|sos|>` +
the instruction in the system part (`"You are a helpful assistant. <instruction><|endofprompt|>"`) + the target
text + `<|task_id|>`, each text tokenized on its own. Output: speech ids until
`<|eos1|>`; the other reserved rows (6561..6760 but eos1) are dropped (upstream's LLM would stop on them,
upstream's BLS would feed them to the flow, whose embedding has 6561 rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer

from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, Decoding, sampling_params, text_then_speech
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
    """Upstream's instruct form (example.py): the instruction inside the system part. An instruction already in
    that form is taken as written; a trailing `<|endofprompt|>` (CosyVoice2's form) is not doubled."""
    if instruction.startswith(SYSTEM_PROMPT) and instruction.endswith(END_OF_PROMPT):
        return instruction
    return f"{SYSTEM_PROMPT} {instruction.removesuffix(END_OF_PROMPT)}{END_OF_PROMPT}"


def system_part(prefix: str, target_text: str) -> str:
    """What goes before the target text: `prefix` with upstream's BLS's default system part unless it carries
    `<|endofprompt|>`; nothing when there is no prefix and the target text carries its own system part (upstream's
    cross-lingual form, written by the caller)."""
    if not prefix and END_OF_PROMPT in target_text:
        return ""
    return with_system_prompt(prefix)


def prompt_text(reference_text: str, target_text: str) -> str:
    return f"{SOS_TOKEN}{system_part(reference_text, target_text)}{target_text}{TASK_ID_TOKEN}"


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
        text = prompt_text(reference_text, target_text)
        ids = text_then_speech(self.tokenizer, text, self.ids.speech_base, prompt_speech_tokens)
        if self.ids.end_of_prompt not in ids:  # speech ids lie past every text id
            raise ValueError(f"the LLM prompt has no {END_OF_PROMPT}")
        return ids

    def cross_lingual_ids(self, target_text: str) -> list[int]:
        """Upstream's cross-lingual form (frontend_cross_lingual): no reference text and no prompt speech tokens in
        the LLM (the flow keeps the reference's prompt); the system part starts the target text."""
        return self.input_ids("", target_text, [])

    def instruct2_ids(self, instruction: str, target_text: str) -> list[int]:
        """Upstream's instruct2 form (frontend_instruct2): the instruction in the system part, then the target
        text, each tokenized on its own (CosyVoice3LM concatenates the two); no prompt speech tokens."""
        ids = [self.ids.sos, *self._encode(instruct_text(instruction)), *self._encode(target_text)]
        return [*ids, self.ids.task_id]

    def text_ids(self, text: str) -> list[int]:
        """`text` tokenized on its own, as upstream's front end tokenizes each piece of a text generator."""
        return self._encode(text)

    def bistream_prompt_ids(self, prompt_text: str) -> list[int]:
        """A bistream's prompt text with upstream's BLS's default system part unless it carries
        `<|endofprompt|>` (an instruction in the instruct form does; cross_lingual's "" is the system part
        alone), tokenized in one piece: the schedule feeds it up to `<|endofprompt|>` right after `<|sos|>`."""
        return self._encode(with_system_prompt(prompt_text))

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

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
        return sampling_params(decoding, self.ids.end)
