"""A Qwen2-style byte-level BPE tokenizer with every Spark-TTS token at its real id.

The BPE part is trained here on a small English + Chinese corpus; the rest of the 151,643 BPE slots are
filler entries that no merge can produce, so the added tokens land where the real `LLM/tokenizer.json` has them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from tritontts.spark import tokens as layout

QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
TRAINED_VOCAB_SIZE = 2048
MODEL_MAX_LENGTH = 32768


@dataclass(frozen=True)
class SpecialTokens:
    """What tokenizer_config.json and special_tokens_map.json declare."""

    eos: str
    pad: str
    additional: tuple[str, ...]


SPARK_SPECIAL_TOKENS = SpecialTokens(layout.EOS_TOKEN, layout.PAD_TOKEN, layout.QWEN_SPECIAL_TOKENS[1:3])

ENGLISH_CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Speech synthesis turns written text into natural sounding audio, one token at a time.
Hello world! How are you today? I'm fine, thanks; we'll see you at 10:30 on Monday, the 3rd of June.
Voice cloning copies the timbre of a short reference recording and speaks new sentences with it.
Triton Inference Server runs models on GPUs, batching requests from many clients together.
Numbers like 1, 22, 333, 4444 and 55555 appear in text, as do prices such as $19.99 or 3.5 percent.
She said: "Don't worry, it's only a test." They've been waiting since eight o'clock in the morning.
"""

CHINESE_CORPUS = """\
吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。豆奶牛奶换着喝，营养更均衡，本节目由豆本豆豆奶特约播出。
身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。
今天天气很好，我们一起去公园散步吧。语音合成技术把文字变成自然流畅的声音。
你好，世界！欢迎使用开源语音合成工具，请输入你想要朗读的文字。
我们的模型支持中文和英文，可以克隆参考音频里的说话人音色。
"""


def _corpus() -> list[str]:
    lines = (ENGLISH_CORPUS + CHINESE_CORPUS).splitlines()
    return [line for line in lines if line] * 4


def _train_bpe() -> tuple[dict[str, int], list[list[str]]]:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _pre_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [m.split(" ") if isinstance(m, str) else list(m) for m in model["merges"]]
    return model["vocab"], merges


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )


@cache
def qwen2_bpe_vocab() -> tuple[dict[str, int], list[list[str]]]:
    """The 151,643-entry BPE vocabulary and its merges (trained once per process; do not mutate)."""
    trained, merges = _train_bpe()
    vocab = dict(sorted(trained.items(), key=lambda kv: kv[1]))
    for index in range(len(vocab), layout.BPE_VOCAB_SIZE):
        vocab[f"<f{index}>"] = index
    assert len(vocab) == layout.BPE_VOCAB_SIZE
    return vocab, merges


def _added_token_entry(token: layout.AddedToken) -> dict:
    return {
        "id": token.id,
        "content": token.content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": token.special,
    }


def _tokenizer_json(vocab: dict[str, int], merges: list[list[str]], added: list[layout.AddedToken]) -> dict:
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token_entry(t) for t in added],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": json.loads(_pre_tokenizer().__getstate__()),
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _tokenizer_config(
    added: list[layout.AddedToken], special: SpecialTokens, chat_template: str | None
) -> dict:
    decoder = {
        str(t.id): {
            "content": t.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": t.special,
        }
        for t in added
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(special.additional),
        "bos_token": None,
    }
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config | {
        "clean_up_tokenization_spaces": False,
        "eos_token": special.eos,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": special.pad,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _special_tokens_map(special: SpecialTokens) -> dict:
    def entry(content: str) -> dict:
        return {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
        }

    return {
        "additional_special_tokens": list(special.additional),
        "eos_token": entry(special.eos),
        "pad_token": entry(special.pad),
    }


def _write_json(path: Path, data: dict, indent: int | None = 2) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=indent) + "\n", encoding="utf-8")


def write_qwen2_tokenizer(
    out_dir: str | Path,
    added: list[layout.AddedToken],
    special: SpecialTokens,
    chat_template: str | None = None,
    slow_files_only: bool = False,
    bpe: tuple[dict[str, int], list[list[str]]] | None = None,
) -> Path:
    """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json, added_tokens.json, vocab.json
    and merges.txt into `out_dir`; `slow_files_only` writes just tokenizer_config.json, vocab.json and
    merges.txt (a tokenizer that transformers builds from them). `bpe` (vocab, merges) replaces the locally
    trained BPE (a converter writing a real tokenizer's). Returns `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = bpe if bpe is not None else qwen2_bpe_vocab()
    if not slow_files_only:
        _write_json(out_dir / "tokenizer.json", _tokenizer_json(vocab, merges, added), indent=None)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(added, special, chat_template))
    if not slow_files_only:
        _write_json(out_dir / "special_tokens_map.json", _special_tokens_map(special))
        _write_json(
            out_dir / "added_tokens.json", {t.content: t.id for t in sorted(added, key=lambda t: t.content)}
        )
    _write_json(out_dir / "vocab.json", vocab, indent=None)
    merges_text = "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges)
    (out_dir / "merges.txt").write_text(merges_text, encoding="utf-8")
    return out_dir


def build_spark_tokenizer(out_dir: str | Path) -> Path:
    """Write Spark-TTS's six tokenizer files into `out_dir`; return `out_dir`."""
    return write_qwen2_tokenizer(out_dir, layout.spark_added_tokens(), SPARK_SPECIAL_TOKENS)
