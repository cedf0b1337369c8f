"""The check every family's first-chunk priority test makes on the real tritonserver: a BLS whose token2wav and
LLM engine run with `first_chunk_priority` gives the same audio as the plain BLS, and its LLM counts held seconds."""

from __future__ import annotations

import numpy as np
from cosyvoice_triton import tokens
from reliability_models import metric_values
from triton_stream import stream_waveforms
from waiting import wait_until

HELD_SECONDS = "tritontts_llm_held_seconds"


def held_seconds(server, llm: str) -> float:
    return metric_values(server.server, HELD_SECONDS).get(f'{{model="{llm}"}}', 0.0)


def same_audio_and_more_held_seconds(server, plain_bls: str, bls: str, llm: str, values: dict) -> None:
    """Three streams of `bls` give `plain_bls`'s audio within 1e-5, and `llm`'s held seconds rise."""
    held_before = held_seconds(server, llm)
    plain = np.concatenate(stream_waveforms(server.grpc_url, plain_bls, values, tokens(100)), axis=None)
    for _ in range(3):
        held = np.concatenate(stream_waveforms(server.grpc_url, bls, values, tokens(100)), axis=None)
        assert held.shape == plain.shape
        np.testing.assert_allclose(held, plain, atol=1e-5)
    wait_until(
        lambda: held_seconds(server, llm),
        lambda seconds: seconds > held_before,
        f"{llm}'s held seconds above {held_before} after three streams of {bls}",
        timeout=10,
    )
