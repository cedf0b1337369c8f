"""Where CosyVoice2's tokens sit in the vocabulary of `cosyvoice2_llm` (and of `CosyVoice-BlankEN`).

Runtime code looks ids up by name (`CosyVoice2TokenIds.from_tokenizer`); the numbers below are the documented
constants, for the synthetic writer, the tests and the one check that upstream's fixed offset holds.
Provenance:
- verified: ORIGINAL_VOCAB_SIZE = 151663, the id of `<|s_0|>`, hard-coded in upstream's Triton models
  (cosyvoice2, token2wav, audio_tokenizer), which add it to speech tokens going in and subtract it coming out.
- verified: 6561 speech tokens (`speech_token_size` of cosyvoice2.yaml), named `<|s_N|>` and followed by
  `<|eos1|> <|eos2|> <|eos3|> <|sos|> <|task_id|>` (examples/grpo/cosyvoice2/pretrained_to_huggingface.py,
  which builds cosyvoice2_llm from llm.pt); the BLS stops at `<|eos1|>`.
- verified: the special tokens CosyVoice2Tokenizer adds to CosyVoice-BlankEN (cosyvoice/tokenizer/tokenizer.py).
- derived: CosyVoice-BlankEN itself holds Qwen2's three added tokens (151643..151645): llm.py names 151646
  `<|endofprompt|>`, and 151646 + 17 new CosyVoice2 tokens = 151663.
- derived: 158229 tokens, padded to a multiple of 128 by `resize_token_embeddings`, give LLM_VOCAB_SIZE.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from tritontts.spark.prompt import _contiguous_base, _require_id

ORIGINAL_VOCAB_SIZE = 151_663
SPEECH_TOKEN_COUNT = 6561
QWEN2_VOCAB_SIZE = 151_936
LLM_VOCAB_PADDING = 128

BLANK_EN_ADDED_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
BLANK_EN_ADDED_BASE = 151_643
COSYVOICE2_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endofprompt|>",
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)
TEXT_EOS_TOKEN = "<|endoftext|>"

SPEECH_TOKEN_TEMPLATE = "<|s_{}|>"
END_TOKEN = "<|eos1|>"
SPEECH_STOP_TOKENS = ("<|eos1|>", "<|eos2|>", "<|eos3|>")
SOS_TOKEN = "<|sos|>"
TASK_ID_TOKEN = "<|task_id|>"
TOKENS_AFTER_SPEECH = (*SPEECH_STOP_TOKENS, SOS_TOKEN, TASK_ID_TOKEN)
TOKEN_COUNT = ORIGINAL_VOCAB_SIZE + SPEECH_TOKEN_COUNT + len(TOKENS_AFTER_SPEECH)
LLM_VOCAB_SIZE = -(-TOKEN_COUNT // LLM_VOCAB_PADDING) * LLM_VOCAB_PADDING


def speech_token(index: int) -> str:
    return SPEECH_TOKEN_TEMPLATE.format(index)


def text_added_tokens() -> list[str]:
    """CosyVoice-BlankEN's added tokens, then the ones CosyVoice2Tokenizer adds, in id order from 151643."""
    new = [t for t in COSYVOICE2_SPECIAL_TOKENS if t not in BLANK_EN_ADDED_TOKENS]
    tokens = [*BLANK_EN_ADDED_TOKENS, *new]
    assert BLANK_EN_ADDED_BASE + len(tokens) == ORIGINAL_VOCAB_SIZE
    return tokens


def llm_added_tokens() -> list[str]:
    """Every added token of cosyvoice2_llm's tokenizer, in id order from 151643 (gap-free to TOKEN_COUNT)."""
    speech = [speech_token(i) for i in range(SPEECH_TOKEN_COUNT)]
    return [*text_added_tokens(), *speech, *TOKENS_AFTER_SPEECH]


@dataclass(frozen=True)
class CosyVoice2TokenIds:
    """Ids of the CosyVoice2 LLM's tokens in one tokenizer, looked up by name."""

    speech_base: int
    sos: int
    task_id: int
    end: int
    stops: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> CosyVoice2TokenIds:
        """Raises ValueError when a token is missing, the speech range has gaps or does not start at
        ORIGINAL_VOCAB_SIZE (upstream's token2wav and audio_tokenizer assume that offset)."""
        base = _contiguous_base(tokenizer, SPEECH_TOKEN_TEMPLATE, SPEECH_TOKEN_COUNT)
        if base != ORIGINAL_VOCAB_SIZE:
            raise ValueError(
                f"{speech_token(0)} is at id {base}, not {ORIGINAL_VOCAB_SIZE}: not a cosyvoice2_llm tokenizer"
            )
        return cls(
            speech_base=base,
            sos=_require_id(tokenizer, SOS_TOKEN),
            task_id=_require_id(tokenizer, TASK_ID_TOKEN),
            end=_require_id(tokenizer, END_TOKEN),
            stops=tuple(_require_id(tokenizer, t) for t in SPEECH_STOP_TOKENS),
        )

    def is_speech(self, token_id: int) -> bool:
        return self.speech_base <= token_id < self.speech_base + SPEECH_TOKEN_COUNT
