"""Where CosyVoice3's tokens sit in the vocabulary of its HF-layout LLM (and of `CosyVoice-BlankEN`).

Runtime code looks ids up by name (`CosyVoice3TokenIds.from_tokenizer`); the constants here serve the synthetic
writer, the converter and the tests. Provenance (upstream @ace7c47):
- verified: CosyVoice3Tokenizer (cosyvoice/tokenizer/tokenizer.py) adds, as special tokens, CosyVoice2's 19
  text specials, `<|endofsystem|>`, 84 ARPAbet phones (vowels bare and with stress 0/1/2, in alphabetical order
  of the phone) and 176 pinyin units (sorted by code point); `<|im_start|>`/`<|im_end|>` already exist, so
  `<|endofprompt|>` is 151646 (hard-coded in CosyVoice3LM.inference).
- verified: scripts/convert_cosyvoice3_to_hf.py then adds `<|s_0|>..<|s_6760|>` (the 6561 + 200 rows of
  `speech_embedding`) as plain tokens, with rows 6561..6564 named `<|sos|> <|eos1|> <|task_id|> <|fill|>`, pads
  the vocabulary to a multiple of 128 and sets eos to `<|eos1|>`.
- derived: with CosyVoice-BlankEN's 151646 tokens, `<|s_0|>` is id 151646 + 278 = 151924; padded vocabulary 158720.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import Tokenizer

from tritontts.cosyvoice2 import tokens as cv2
from tritontts.spark.prompt import _contiguous_base, _require_id

SPEECH_TOKEN_COUNT = 6561
RESERVED_SPEECH_IDS = 200
SPEECH_VOCAB = SPEECH_TOKEN_COUNT + RESERVED_SPEECH_IDS
RENAMED = {SPEECH_TOKEN_COUNT + 0: "<|sos|>", SPEECH_TOKEN_COUNT + 1: "<|eos1|>",
           SPEECH_TOKEN_COUNT + 2: "<|task_id|>", SPEECH_TOKEN_COUNT + 3: "<|fill|>"}  # fmt: skip
SOS_TOKEN, END_TOKEN, TASK_ID_TOKEN = RENAMED[6561], RENAMED[6562], RENAMED[6563]
END_OF_PROMPT = "<|endofprompt|>"
END_OF_PROMPT_ID = 151_646
SYSTEM_PROMPT = "You are a helpful assistant."

_VOWELS = "AA AE AH AO AW AY EH ER EY IH IY OW OY UH UW".split()
_CONSONANTS = "B CH D DH F G HH JH K L M N NG P R S SH T TH V W Y Z ZH".split()
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng "
    "iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo "
    "uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x "
    "y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù "
    "ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu "
    "ǔ ǔn ǘ ǚ ǜ"
).split()


def phone_tokens() -> list[str]:
    arpabet = []
    for phone in sorted(_VOWELS + _CONSONANTS):
        arpabet += [f"[{phone}]"] + ([f"[{phone}{s}]" for s in "012"] if phone in _VOWELS else [])
    return arpabet + [f"[{unit}]" for unit in _PINYIN]


def text_special_tokens() -> list[str]:
    """CosyVoice3Tokenizer's additional special tokens, in its order."""
    return [*cv2.COSYVOICE2_SPECIAL_TOKENS, "<|endofsystem|>", *phone_tokens()]


def text_added_tokens() -> list[str]:
    """BlankEN's added tokens, then the new ones of `text_special_tokens`, in id order from 151643."""
    new = [t for t in text_special_tokens() if t not in cv2.BLANK_EN_ADDED_TOKENS]
    return [*cv2.BLANK_EN_ADDED_TOKENS, *new]


TEXT_VOCAB_SIZE = cv2.BLANK_EN_ADDED_BASE + len(text_added_tokens())  # the id of <|s_0|>


def speech_token(index: int) -> str:
    return RENAMED.get(index, f"<|s_{index}|>")


def speech_added_tokens() -> list[str]:
    return [speech_token(i) for i in range(SPEECH_VOCAB)]


def padded_vocab_size(tokens: int, multiple: int = 128) -> int:
    return -(-tokens // multiple) * multiple


LLM_VOCAB_SIZE = padded_vocab_size(TEXT_VOCAB_SIZE + SPEECH_VOCAB)


@dataclass(frozen=True)
class CosyVoice3TokenIds:
    """Ids of the CosyVoice3 LLM's tokens in one tokenizer, looked up by name."""

    speech_base: int
    sos: int
    task_id: int
    end: int
    end_of_prompt: int
    reserved: tuple[int, ...]
    """every id of speech rows 6561..6760: upstream's CosyVoice3LM stops on any of them"""

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> CosyVoice3TokenIds:
        """Raises ValueError when a token is missing or the speech rows are not one contiguous range."""
        base = _contiguous_base(tokenizer, "<|s_{}|>", SPEECH_TOKEN_COUNT)
        ids = [_require_id(tokenizer, speech_token(i)) for i in range(SPEECH_TOKEN_COUNT, SPEECH_VOCAB)]
        if ids != list(range(base + SPEECH_TOKEN_COUNT, base + SPEECH_VOCAB)):
            raise ValueError("the 200 reserved speech tokens do not follow <|s_6560|>: not a CosyVoice3 LLM")
        return cls(
            speech_base=base,
            sos=_require_id(tokenizer, SOS_TOKEN),
            task_id=_require_id(tokenizer, TASK_ID_TOKEN),
            end=_require_id(tokenizer, END_TOKEN),
            end_of_prompt=_require_id(tokenizer, END_OF_PROMPT),
            reserved=tuple(ids),
        )

    def is_speech(self, token_id: int) -> bool:
        return self.speech_base <= token_id < self.speech_base + SPEECH_TOKEN_COUNT
