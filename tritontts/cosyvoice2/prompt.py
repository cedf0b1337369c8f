"""CosyVoice2's LLM input and output, as upstream's Triton BLS (`model_repo/cosyvoice2/1/model.py`) has them.

Input: the tokenizer encodes `<|sos|>{reference_text}{target_text}<|task_id|>`, and the reference's speech
tokens follow as `<|s_N|>` ids (N + ORIGINAL_VOCAB_SIZE); the model continues speaking. Output: speech ids
until `<|eos1|>`, each `<|s_N|>` id minus the offset giving the flow's token N.

Upstream's other front ends (`cosyvoice/cli/frontend.py`) drop the reference's speech tokens from the LLM's
input, which then ends at `<|task_id|>` (`Qwen2LM.inference` with an empty prompt_speech_token):
`frontend_cross_lingual` also drops the transcript, and `frontend_instruct2` puts the instruction (as the caller
wrote it; upstream's examples end it with `<|endofprompt|>`) where the transcript was, each text tokenized on its
own. The flow still takes the reference's tokens, mel and speaker embedding in every mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from tritontts.cosyvoice2.tokens import SOS_TOKEN, SPEECH_TOKEN_COUNT, TASK_ID_TOKEN, CosyVoice2TokenIds
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.prompt import load_llm_tokenizer

PROMPT_TEMPLATE = SOS_TOKEN + "{input_text}" + TASK_ID_TOKEN
MODES = ("zero_shot", "cross_lingual", "instruct2")
ENDOFPROMPT = "<|endofprompt|>"


@dataclass(frozen=True)
class Decoding:
    """What the BLS sends tensorrt_llm for every request (end_id and pad_id are `<|eos1|>`)."""

    max_tokens: int = 750
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.1
    seed: int = 42


UPSTREAM_DECODING = Decoding()


def prompt_text(reference_text: str, target_text: str) -> str:
    return PROMPT_TEMPLATE.format(input_text=f"{reference_text}{target_text}")


def check_speech_tokens(tokens: Iterable[int], name: str = "prompt speech tokens") -> list[int]:
    """The tokens as ints; ValueError naming `name` when one lies outside 0..6560."""
    values = [int(t) for t in tokens]
    bad = [(i, t) for i, t in enumerate(values) if not 0 <= t < SPEECH_TOKEN_COUNT]
    if bad:
        i, t = bad[0]
        raise ValueError(
            f"{name}: {len(bad)} value(s) outside 0..{SPEECH_TOKEN_COUNT - 1}, first {t} at position {i}"
        )
    return values


def text_then_speech(
    tokenizer: Tokenizer, text: str, speech_base: int, prompt_speech_tokens: Iterable[int]
) -> list[int]:
    """`text` encoded, then the speech tokens (0..6560) as the ids `speech_base + N`."""
    speech = check_speech_tokens(prompt_speech_tokens)
    return [*tokenizer.encode(text).ids, *(speech_base + t for t in speech)]


def sampling_params(decoding: Decoding, end_id: int) -> SamplingParams:
    """What the BLS asks of the LLM: `decoding`, ending (and padding) with `end_id`."""
    return SamplingParams(
        max_tokens=decoding.max_tokens,
        temperature=decoding.temperature,
        top_k=decoding.top_k,
        top_p=decoding.top_p,
        repetition_penalty=decoding.repetition_penalty,
        seed=decoding.seed,
        end_id=end_id,
        pad_id=end_id,
    )


class CosyVoice2Prompt:
    """Builds LLM input ids and reads speech tokens out of LLM output ids, with one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids = CosyVoice2TokenIds.from_tokenizer(tokenizer)
        # a process's first prompt costs several later ones, which each BLS instance's first request paid
        self.input_ids("预热。", "Warm up, 预热。", [0])

    @classmethod
    def from_llm_dir(cls, llm_dir: str | Path) -> CosyVoice2Prompt:
        """From `tokenizer.json` of a cosyvoice2_llm directory."""
        return cls(load_llm_tokenizer(llm_dir))

    def input_ids(
        self, reference_text: str, target_text: str, prompt_speech_tokens: Iterable[int]
    ) -> list[int]:
        """Upstream's `parse_input`: the encoded prompt text, then the reference's speech tokens (0..6560)."""
        return text_then_speech(
            self.tokenizer,
            prompt_text(reference_text, target_text),
            self.ids.speech_base,
            prompt_speech_tokens,
        )

    def cross_lingual_ids(self, target_text: str) -> list[int]:
        """`frontend_cross_lingual`: `<|sos|>`, the target text, `<|task_id|>`; no transcript, no speech tokens."""
        return [self.ids.sos, *self._encode(target_text), self.ids.task_id]

    def instruct2_ids(self, instruct_text: str, target_text: str) -> list[int]:
        """`frontend_instruct2`: `<|sos|>`, the instruction, the target text, `<|task_id|>`; no speech tokens."""
        return [self.ids.sos, *self._encode(instruct_text), *self._encode(target_text), self.ids.task_id]

    def text_ids(self, text: str) -> list[int]:
        """`text` tokenized on its own, as upstream's front end tokenizes each piece of a text generator."""
        return self._encode(text)

    def bistream_prompt_ids(self, prompt_text: str) -> list[int]:
        """A bistream's prompt text (transcript or instruction; "" in cross_lingual) as the schedule's ids."""
        return self._encode(prompt_text) if prompt_text else []

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def speech_tokens(self, output_ids: Sequence[int]) -> list[int]:
        """The flow's tokens (0..6560) for generated ids, which end before `<|eos1|>`.

        Raises ValueError on any other id: upstream would hand it to the flow, whose embedding has 6561 rows.
        """
        base = self.ids.speech_base
        values = [int(t) - base for t in output_ids]
        bad = [(i, t + base) for i, t in enumerate(values) if not 0 <= t < SPEECH_TOKEN_COUNT]
        if bad:
            i, token_id = bad[0]
            raise ValueError(
                f"LLM output: {len(bad)} id(s) that are not speech tokens, first {token_id} at position {i}"
            )
        return values

    def sampling_params(self, decoding: Decoding = UPSTREAM_DECODING) -> SamplingParams:
        return sampling_params(decoding, self.ids.end)
