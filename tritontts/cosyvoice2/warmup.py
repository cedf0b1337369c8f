"""A fresh token2wav instance's first streams are slow: CUDA loads each kernel on first use, and a vocoder
captures the graph of a chunk length the second time it sees it. With several instances each pays this on
its own first requests (measured on an H200: the first streams of four CosyVoice2 instances took 280-720 ms
to their first chunk, later ones 130-170 ms). Warming up runs streams the way a BLS calls these models
(upstream's exponential chunk schedule) before serving."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tritontts.cosyvoice2.token2wav import StreamChunk, StreamSchedule
from tritontts.cosyvoice2.tokens import SPEECH_TOKEN_COUNT

log = logging.getLogger(__name__)

WARMUP_TOKENS = 250  # 10 s of speech: the first four chunks of the exponential schedule, then a final one


def warm_up_streams(
    run_many: Callable[[Sequence[Any]], Sequence[Any]],
    make_call: Callable[[torch.Tensor, StreamChunk, str], Any],
    close: Callable[[str], None] | None = None,
    schedule: StreamSchedule | None = None,
    tokens: int = WARMUP_TOKENS,
    rounds: int = 2,
) -> float:
    """`rounds` streams of `tokens` random target tokens, each chunk's call made by `make_call(target tokens
    so far [1, n], chunk, stream id)` and run alone through `run_many`; returns the seconds it took."""
    schedule = schedule or StreamSchedule.from_strategy("exponential")
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    for round_index in range(rounds):
        target = torch.randint(0, SPEECH_TOKEN_COUNT, (1, tokens), generator=generator, dtype=torch.int32)
        stream_id = f"warm-up-{round_index}"
        for chunk in schedule.plan(tokens):
            result = run_many([make_call(target[:, : chunk.token_end], chunk, stream_id)])[0]
            if isinstance(result, Exception):
                raise result
        if close is not None:
            close(stream_id)
    seconds = time.perf_counter() - started
    log.info("token2wav warm-up: %d streams of %d tokens in %.1f s", rounds, tokens, seconds)
    return seconds


def streamed_mel_lengths(
    schedule: StreamSchedule | None = None, tokens: int = WARMUP_TOKENS, token_mel_ratio: int = 2
) -> list[int]:
    """The mel frames a stateless vocoder gets at each non-final chunk when its BLS sends all mel so far
    (CosyVoice3's): each chunk's flow gives the mel of its tokens up to the look-ahead."""
    schedule = schedule or StreamSchedule.from_strategy("exponential")
    return [
        token_mel_ratio * (chunk.token_end - schedule.pre_lookahead_len)
        for chunk in schedule.plan(tokens)
        if not chunk.finalize
    ]


def warm_up_vocoder(vocode: Callable[[torch.Tensor], Any], lengths: Sequence[int], rounds: int = 2) -> float:
    """`vocode(mel [1, 80, T])` `rounds` times for each T in `lengths`; returns the seconds it took."""
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    for _ in range(rounds):
        for frames in lengths:
            vocode(torch.randn(1, 80, frames, generator=generator))
    seconds = time.perf_counter() - started
    log.info("vocoder warm-up: mel lengths %s, %d rounds in %.1f s", list(lengths), rounds, seconds)
    return seconds
