"""A stream's first-chunk stages are recorded once the chunk has been taken from the service's generator (sent),
not before: recording them is a metric update, a round trip to the server, which the client's first chunk
must not wait for. Through tritonserver the metrics themselves are checked in tests/test_first_chunk_stages.py
and tests/test_spark_triton.py."""

from __future__ import annotations

import numpy as np
import pytest
from cosyvoice2_models import cached_voice_service, tiny_prompter

from tritontts.cosyvoice2.service import FIRST_CHUNK_STAGES as COSYVOICE2_STAGES
from tritontts.cosyvoice2.service import CosyVoice2Request
from tritontts.spark.service import FIRST_CHUNK_STAGES as SPARK_STAGES
from tritontts.spark.service import (
    RequestLimits,
    SparkPrompter,
    SparkTTSService,
    VoiceTokens,
    check_request,
)
from tritontts.synthetic.tokenizer import build_spark_tokenizer


def spark_stream(tmp_path, recorded: list, vocoded: list):
    prompter = SparkPrompter(build_spark_tokenizer(tmp_path))

    def generate(prompt_ids, sampling, streaming):
        for start in range(0, 1000, 10):
            yield prompter.ids.semantic_token_ids(np.arange(start, start + 10))

    def vocode(global_tokens, semantic_tokens, first_chunk):
        vocoded.append(first_chunk)
        return np.zeros(320 * semantic_tokens.size, dtype=np.float32)

    service = SparkTTSService(prompter, None, generate, vocode)
    voice = VoiceTokens(np.arange(32, dtype=np.int32), np.arange(0, dtype=np.int32))
    request = check_request(None, "", "hello", RequestLimits(), voice=voice)
    return service.stream(request, lambda stages: recorded.append(dict(stages)))


def cosyvoice2_stream(tmp_path, recorded: list, vocoded: list):
    prompter = tiny_prompter(tmp_path)

    def generate(prompt_ids, sampling, streaming):
        for _ in range(8):
            yield np.arange(10, dtype=np.int32) + prompter.ids.speech_base

    def token2wav(tokens, voice, offset, finalize, request_id):
        vocoded.append(offset)
        return np.zeros(960, dtype=np.float32)

    service = cached_voice_service(prompter, generate, token2wav)
    return service.stream(CosyVoice2Request(None, "", "hello"), "r1", lambda s: recorded.append(dict(s)))


FAMILIES = [(spark_stream, SPARK_STAGES), (cosyvoice2_stream, COSYVOICE2_STAGES)]
IDS = ["spark", "cosyvoice2"]


@pytest.mark.parametrize("make, stages", FAMILIES, ids=IDS)
def test_first_chunk_stages_are_recorded_after_the_chunk_is_taken(tmp_path, make, stages):
    recorded, vocoded = [], []
    chunks = make(tmp_path, recorded, vocoded)
    first = next(chunks)
    assert first.size and len(vocoded) == 1 and recorded == []
    second = next(chunks)
    assert second.size and len(vocoded) == 2
    assert len(recorded) == 1 and tuple(recorded[0]) == stages
    assert all(seconds >= 0 for seconds in recorded[0].values())
    rest = list(chunks)
    assert rest and len(recorded) == 1


@pytest.mark.parametrize("make, stages", FAMILIES, ids=IDS)
def test_a_stream_closed_after_its_first_chunk_records_it_once(tmp_path, make, stages):
    recorded, vocoded = [], []
    chunks = make(tmp_path, recorded, vocoded)
    next(chunks)
    assert recorded == []
    chunks.close()
    assert len(vocoded) == 1 and len(recorded) == 1 and tuple(recorded[0]) == stages


@pytest.mark.parametrize("make", [make for make, _ in FAMILIES], ids=IDS)
def test_a_stream_closed_before_its_first_chunk_records_nothing(tmp_path, make):
    recorded, vocoded = [], []
    make(tmp_path, recorded, vocoded).close()
    assert vocoded == [] and recorded == []
