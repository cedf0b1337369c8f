"""A whole synthetic Spark-TTS-0.5B checkpoint directory, laid out like the hub repository."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tritontts.spark import tokens
from tritontts.spark.layout import missing_files
from tritontts.synthetic.length_counter import LengthCounter, bpe_token_seconds, text_weights
from tritontts.synthetic.qwen2 import write_qwen2
from tritontts.synthetic.tokenizer import build_spark_tokenizer, qwen2_bpe_vocab

MARKER = "SYNTHETIC.json"
PRESETS = ("tiny", "full")
SEMANTIC_TOKEN_RATE = 50  # BiCodec semantic tokens per second of audio


def length_counter() -> LengthCounter:
    """Speech ends at <|im_end|> once the semantic tokens in the context cover the text at 50 tokens/s."""
    return LengthCounter(SEMANTIC_TOKEN_RATE, tokens.token_ids()[tokens.EOS_TOKEN])


def row_weights(vocab_size: int = tokens.VOCAB_SIZE) -> torch.Tensor:
    """The length counter's weight per id: text by its spoken seconds, semantic tokens 0, the rest 1."""
    vocab, _ = qwen2_bpe_vocab()
    weights = text_weights(bpe_token_seconds(vocab, vocab_size), SEMANTIC_TOKEN_RATE)
    weights[tokens.SEMANTIC_BASE : tokens.SEMANTIC_BASE + tokens.SEMANTIC_COUNT] = 0
    return weights


def write_spark_llm(llm_dir: str | Path, preset: str = "tiny", seed: int = 0, **qwen2_options) -> Path:
    """`LLM/`: the Qwen2 config and weights plus the tokenizer files."""
    llm_dir = Path(llm_dir)
    qwen2_options.setdefault(
        "speech_tokens", (tokens.SEMANTIC_BASE, tokens.SEMANTIC_BASE + tokens.SEMANTIC_COUNT)
    )
    qwen2_options.setdefault("counter", length_counter())
    qwen2_options.setdefault("row_weights", row_weights(qwen2_options.get("vocab_size", tokens.VOCAB_SIZE)))
    write_qwen2(llm_dir, preset, seed, **qwen2_options)
    build_spark_tokenizer(llm_dir)
    return llm_dir


def read_marker(out_dir: str | Path) -> dict | None:
    path = Path(out_dir) / MARKER
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def is_complete(out_dir: str | Path, preset: str, seed: int) -> bool:
    """True when `out_dir` holds every required file and was written with this preset and seed."""
    marker = read_marker(out_dir)
    same = marker is not None and marker.get("preset") == preset and marker.get("seed") == seed
    return same and not missing_files(out_dir)


def write_spark_checkpoint(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write config.yaml, BiCodec/, wav2vec2-large-xlsr-53/, LLM/ and the SYNTHETIC.json marker; return out_dir."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {PRESETS}")
    from tritontts.synthetic.bicodec import write_bicodec
    from tritontts.synthetic.wav2vec2 import write_wav2vec2

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bicodec(out_dir, preset, seed)
    write_wav2vec2(out_dir / "wav2vec2-large-xlsr-53", preset, seed)
    write_spark_llm(out_dir / "LLM", preset, seed)
    missing = missing_files(out_dir)
    if missing:
        raise RuntimeError(f"synthetic checkpoint in {out_dir} is incomplete: {', '.join(missing)}")
    marker = {"preset": preset, "seed": seed, "note": "random weights, not a trained model"}
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out_dir
