"""Spark-TTS in one process: audio tokenizer (wav2vec2 + BiCodec) → LLM → BiCodec vocoder, batch by batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_llm import Generate, llm_backend, resolve_dtype
from tritontts.bench.offline_pipeline import forced_token_counts
from tritontts.bench.offline_results import StageNames, StageTimes
from tritontts.bench.offline_settings import Decoding, OfflineSettings
from tritontts.bench.offline_timing import synchronize, timed
from tritontts.spark import tokens
from tritontts.spark.codec import SparkCodec
from tritontts.spark.service import SAMPLE_RATE, TOKEN_RATE, SparkPrompter

NAMES = StageNames(front="tokenizer", back="vocoder", speech_tokens="semantic_tokens")
MAX_NEW_TOKENS = 1500


def plan_max_seq_len(rows: Sequence[Utterance], prompter: SparkPrompter, max_new_tokens: int) -> int:
    """Room for the longest prompt (text + 34 markers and global tokens + one semantic token per 320
    samples of reference audio, with some slack) plus the generated tokens, rounded up to 256."""
    longest = 0
    for u in rows:
        text = len(prompter.tokenizer.encode(u.prompt_text + u.target_text, add_special_tokens=False).ids)
        reference = len(u.prompt_audio) * SAMPLE_RATE // (u.sample_rate * 320) + 2
        longest = max(longest, text + reference + 40)
    return -(-(longest + max_new_tokens) // 256) * 256


class SparkPipeline:
    names = NAMES
    sample_rate = SAMPLE_RATE
    token_rate = TOKEN_RATE

    def __init__(
        self, codec: SparkCodec, prompter: SparkPrompter, generate: Generate, max_seq_len: int
    ) -> None:
        self.codec = codec
        self.prompter = prompter
        self.generate = generate
        self.device = codec.device
        self.decoding = decoding_of(prompter)
        self.max_seq_len = max_seq_len

    def speech_token_count(self, generated: list[int]) -> int:
        return len(self.prompter.ids.semantic_ids(generated))

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]:
        synchronize(self.device)
        start = time.perf_counter()
        voices, tokenizer_s = timed(self.device, self.codec.tokenize, list(wavs))
        prompts = [
            self.prompter.prompt_ids(u.prompt_text, u.target_text, v)
            for u, v in zip(rows, voices, strict=True)
        ]
        generated, llm_s = timed(self.device, self.generate, prompts, list(forced))
        semantic = [self.prompter.ids.semantic_ids(ids) for ids in generated]
        speaking = [i for i, s in enumerate(semantic) if s]
        audio = [np.zeros(0, dtype=np.float32) for _ in rows]
        vocoder_s = 0.0
        if speaking:
            globals_ = [voices[i].global_tokens for i in speaking]
            semantics = [np.asarray(semantic[i], dtype=np.int64) for i in speaking]
            vocoded, vocoder_s = timed(self.device, self.codec.detokenize, globals_, semantics)
            for i, wav in zip(speaking, vocoded, strict=True):
                audio[i] = wav
        synchronize(self.device)
        times = StageTimes(
            rows=len(rows),
            front_s=tokenizer_s,
            llm_s=llm_s,
            back_s=vocoder_s,
            wall_s=time.perf_counter() - start,
            tokens=sum(len(g) for g in generated),
            speech_tokens=sum(len(s) for s in semantic),
            audio_s=sum(len(a) for a in audio) / self.codec.sample_rate,
        )
        return audio, generated, times


def decoding_of(prompter: SparkPrompter) -> Decoding:
    return Decoding(
        end_id=prompter.end_id, pad_id=prompter.pad_id, output_tokens_from=tokens.OUTPUT_WINDOW_FROM
    )


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[SparkPipeline, int, dict]:
    """The pipeline, the rate its reference audio is read at, and what the report says about its dtypes."""
    llm_dir = Path(settings.model_dir) / "LLM"
    dtype = resolve_dtype(settings.dtype, device, llm_dir)
    prompter = SparkPrompter(llm_dir)
    max_new_tokens = settings.max_new_tokens or MAX_NEW_TOKENS
    forced = forced_token_counts(rows, settings.realistic_lengths, TOKEN_RATE)
    most = max((n for n in forced if n is not None), default=max_new_tokens)
    max_seq_len = settings.max_seq_len or plan_max_seq_len(rows, prompter, most)
    codec = SparkCodec(settings.model_dir, device)
    generate = llm_backend(
        settings, llm_dir, decoding_of(prompter), device, dtype, max_seq_len, max_new_tokens
    )
    extra = {"dtype": str(dtype).removeprefix("torch."), "codec_dtype": "float32"}
    return SparkPipeline(codec, prompter, generate, max_seq_len), SAMPLE_RATE, extra
