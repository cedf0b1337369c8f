"""What the runner asks of one model's pipeline, and the inputs it hands over: each row's reference audio at the
pipeline's rate and, with --realistic-lengths, the number of tokens each row must generate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from tritontts.bench.dataset import Utterance
from tritontts.bench.durations import expected_tokens
from tritontts.bench.offline_results import StageNames, StageTimes
from tritontts.bench.offline_settings import Decoding
from tritontts.dsp.resample import resample


class OfflinePipeline(Protocol):
    """One model's front end, LLM backend and decoder; `run_batch` does one batch and times its stages."""

    names: StageNames
    sample_rate: int
    """of the audio it returns"""
    token_rate: int
    """speech tokens per second of audio, for --realistic-lengths"""
    decoding: Decoding
    max_seq_len: int | None
    """None when the LLM runs elsewhere"""

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]: ...

    def speech_token_count(self, generated: list[int]) -> int: ...


@runtime_checkable
class WarmupAware(Protocol):
    """A pipeline that caches per reference voice forgets the warm-up's voices before the measured pass."""

    def after_warmup(self) -> None: ...


def to_rate(rows: Sequence[Utterance], sample_rate: int) -> list[np.ndarray]:
    return [
        np.asarray(
            u.prompt_audio
            if u.sample_rate == sample_rate
            else resample(u.prompt_audio, u.sample_rate, sample_rate),
            dtype=np.float32,
        )
        for u in rows
    ]


def forced_token_counts(rows: Sequence[Utterance], realistic: bool, token_rate: int) -> list[int | None]:
    return [expected_tokens(u.target_text, token_rate) if realistic else None for u in rows]
