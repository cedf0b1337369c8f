"""Upstream's `dynamic_chunk_strategy` values in our BLS schedule: exponential, time_based, and our fixed.

time_based (upstream's cosyvoice2 and cosyvoice3 BLS): after chunk k >= 1 the hop follows how far the audio sent
runs ahead of the time spent, in average chunk times: > 4 → all pending tokens rounded up to a multiple of
token_hop_len, > 2 → rounded down, else token_hop_len; never under token_hop_len. The hops therefore stay
multiples of token_hop_len, which the served stream below shows.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_models import PREFIX, TIME_BASED, TOKEN_HOP_LEN, build_cosyvoice2_models
from triton_stream import stream_waveforms

from tritontts.audio import load_wav
from tritontts.cosyvoice2.token2wav import STRATEGIES, StreamSchedule

TRITON_MODELS = [build_cosyvoice2_models]
SAMPLES_PER_TOKEN = 960
WITHHELD_SAMPLES = 8 * 480


def test_fixed_and_exponential_hops():
    fixed = StreamSchedule.from_strategy("fixed")
    exponential = StreamSchedule.from_strategy("exponential")
    assert [fixed.next_hop(k, 0, 0, 1.0) for k in range(4)] == [15, 15, 15, 15]
    assert [exponential.next_hop(k, 0, 0, 1.0) for k in range(4)] == [25, 50, 100, 200]
    assert exponential.next_hop(0, 0, 0, 0.0) == exponential.hop_len(1)


@pytest.mark.parametrize(
    ("chunk_index", "token_offset", "tokens_so_far", "elapsed_s", "hop"),
    [
        (0, 15, 200, 0.01, 15),  # after the first chunk the hop stays
        (1, 40, 100, 0.2, 75),  # 1.6 s of audio in 0.2 s (0.1 s a chunk): 14 ahead → 60 pending up: 75
        (1, 40, 70, 0.5, 45),  # 1.6 s in 0.5 s (0.25 a chunk): 4.4 ahead → 30 pending rounded up: 45
        (1, 40, 70, 0.6, 30),  # 1.6 s in 0.6 s (0.3 a chunk): 3.3 ahead → 30 pending rounded down: 30
        (1, 40, 50, 1.0, 15),  # 1.6 s in 1.0 s (0.5 a chunk): 1.2 ahead → the floor
        (2, 100, 110, 0.3, 15),  # far ahead but only 10 pending: rounded up to one hop
        (1, 40, 45, 0.6, 15),  # 3.3 ahead, 5 pending rounded down to 0: the floor
    ],
)
def test_time_based_hops_follow_upstreams_rule(chunk_index, token_offset, tokens_so_far, elapsed_s, hop):
    schedule = StreamSchedule.from_strategy("time_based")
    assert schedule.next_hop(chunk_index, token_offset, tokens_so_far, elapsed_s) == hop


def test_time_based_has_no_plan_ahead_and_unknown_strategies_are_refused():
    assert STRATEGIES == ("exponential", "fixed", "time_based")
    with pytest.raises(ValueError, match="next_hop"):
        StreamSchedule.from_strategy("time_based").plan(60)
    with pytest.raises(ValueError, match="dynamic_chunk_strategy must be one of"):
        StreamSchedule.from_strategy("linear")


@pytest.fixture(scope="module")
def server(triton):
    leaves = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm")
    return triton.load(*(PREFIX + leaf for leaf in leaves), TIME_BASED)


def test_a_time_based_stream_hops_by_whole_token_hops_and_adds_up(server, prompt_zh):
    wav = load_wav(prompt_zh, 16000)[: 16000 * 3]
    values = {
        "target_text": np.array([["身临其境，换新体验。".encode()]], dtype=object),
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        "reference_text": np.array([[PROMPT_ZH_TEXT[:14].encode()]], dtype=object),
    }
    count = 90
    chunks = stream_waveforms(
        server.grpc_url, TIME_BASED, values, {"min_new_tokens": count, "max_new_tokens": count}
    )
    sizes = [c.size for c in chunks]
    assert sum(sizes) == count * SAMPLES_PER_TOKEN
    assert len(sizes) >= 2
    assert sizes[0] == TOKEN_HOP_LEN * SAMPLES_PER_TOKEN - WITHHELD_SAMPLES  # the first hop is token_hop_len
    hop_samples = TOKEN_HOP_LEN * SAMPLES_PER_TOKEN
    assert all(size % hop_samples == 0 and size >= hop_samples for size in sizes[1:-1]), sizes
    joined = np.concatenate(chunks)
    assert np.all(np.isfinite(joined)) and 0 < np.abs(joined).max() <= 1.0
