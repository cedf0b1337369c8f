"""A CosyVoice2 stream cut short ends its token2wav stream (the BLS's `end_stream`), one read to its end does not."""

from __future__ import annotations

import numpy as np
import pytest
from cosyvoice2_models import cached_voice_service, tiny_prompter

from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.cosyvoice2.service import CosyVoice2Request


@pytest.fixture(scope="module")
def prompter(tmp_path_factory) -> CosyVoice2Prompt:
    return tiny_prompter(tmp_path_factory.mktemp("llm"))


def service_logging(prompter: CosyVoice2Prompt, ended: list, calls: list, fail_at: int | None = None):
    def generate(prompt_ids, sampling, streaming):
        for _ in range(8):
            yield np.arange(10, dtype=np.int32) + prompter.ids.speech_base

    def token2wav(tokens, voice, offset, finalize, request_id):
        calls.append((offset, finalize))
        if fail_at is not None and len(calls) > fail_at:
            raise RuntimeError("token2wav failed")
        return np.zeros(960, dtype=np.float32)

    return cached_voice_service(
        prompter,
        generate,
        token2wav,
        end_stream=lambda voice, offset, request_id: ended.append((voice.text, offset, request_id)),
    )


def test_a_stream_closed_after_its_first_chunk_is_ended_once(prompter):
    ended, calls = [], []
    chunks = service_logging(prompter, ended, calls).stream(CosyVoice2Request(None, "", "hello"), "r1")
    next(chunks)
    chunks.close()
    assert calls == [(0, False)]
    assert ended == [("cached text ", 15, "r1")]  # the offset its finalize call would have had


def test_a_stream_read_to_its_end_is_not_ended_again(prompter):
    ended, calls = [], []
    list(service_logging(prompter, ended, calls).stream(CosyVoice2Request(None, "", "hello"), "r2"))
    assert calls[-1][1] is True and all(not finalize for _, finalize in calls[:-1])
    assert ended == []


def test_a_stream_failing_after_its_first_chunk_is_ended_and_one_failing_before_is_not(prompter):
    ended, calls = [], []
    with pytest.raises(RuntimeError, match="token2wav failed"):
        list(
            service_logging(prompter, ended, calls, fail_at=1).stream(CosyVoice2Request(None, "", "hi"), "r3")
        )
    assert ended == [("cached text ", 15, "r3")]
    ended.clear()
    with pytest.raises(RuntimeError, match="token2wav failed"):
        list(service_logging(prompter, ended, [], fail_at=0).stream(CosyVoice2Request(None, "", "hi"), "r4"))
    assert ended == []
