"""CosyVoice2's LLM over a chat-completions endpoint: upstream's payload, `<|s_N|>` parsing, errors,
cancelling, and the service's `generate_chat` seam. The endpoint is an httpx mock transport here;
test_disaggregated.py runs the real server.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tritontts.cosyvoice2.llm_http import (
    ChatEndpoint,
    ChatSpeechClient,
    SpeechTokenParser,
    speech_chat_payload,
)
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, Decoding
from tritontts.cosyvoice2.service import CosyVoice2Request, CosyVoice2Service, Voice
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.service import TokenBudget
from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm

URL = "http://llm.test/v1/chat/completions"
SAMPLING = SamplingParams(
    max_tokens=750, temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=1.1, seed=None
)


def sse_body(pieces: list[str]) -> bytes:
    events = [{"choices": [{"index": 0, "delta": {"content": piece}}]} for piece in pieces]
    lines = [f"data: {json.dumps(event)}\n\n" for event in events] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def client_answering(handler) -> ChatSpeechClient:
    return ChatSpeechClient(ChatEndpoint(URL), httpx.Client(transport=httpx.MockTransport(handler)))


def test_payload_is_upstreams_with_the_token_budget():
    payload = speech_chat_payload("ref ", "target", [12, 0, 6560], SAMPLING)
    assert payload == {
        "model": "trt_engines_bfloat16",
        "messages": [
            {"role": "user", "content": "ref target"},
            {"role": "assistant", "content": "<|s_12|><|s_0|><|s_6560|>"},
        ],
        "max_tokens": 750,
        "temperature": 0.8,
        "top_p": 0.95,
        "top_k": 50,
        "repetition_penalty": 1.1,
        "stop": ["<|eos1|>", "<|eos|>"],
        "stream": True,
    }
    budget = speech_chat_payload("", "t", [1], SamplingParams(min_tokens=30, max_tokens=30, seed=7))
    assert (budget["min_tokens"], budget["max_tokens"], budget["seed"]) == (30, 30, 7)


def test_bad_prompt_speech_token_is_named():
    with pytest.raises(ValueError, match="prompt speech tokens"):
        speech_chat_payload("", "t", [6561], SAMPLING)


def test_parser_keeps_a_token_split_across_pieces():
    parser = SpeechTokenParser()
    assert parser.feed("<|s_1|><|s_") == [1 + ORIGINAL_VOCAB_SIZE]
    assert parser.feed("22|>text<|s_3|>") == [22 + ORIGINAL_VOCAB_SIZE, 3 + ORIGINAL_VOCAB_SIZE]
    assert parser.feed("") == []


def test_generate_streams_llm_ids_and_sends_the_payload():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=sse_body(["<|s_5|>", "<|s_6|><|s", "_7|>", ""]))

    pieces = list(client_answering(handler).generate("a", "b", np.array([1, 2]), SAMPLING))
    assert [(p - ORIGINAL_VOCAB_SIZE).tolist() for p in pieces] == [[5], [6], [7]]
    assert all(p.dtype == np.int32 for p in pieces)
    assert seen[0]["messages"][1]["content"] == "<|s_1|><|s_2|>"


def test_failed_endpoint_names_url_and_status():
    client = client_answering(lambda request: httpx.Response(503, text="engine is down"))
    with pytest.raises(RuntimeError, match=rf"{URL} answered HTTP 503: engine is down"):
        list(client.generate("a", "b", np.array([1]), SAMPLING))


def test_unreachable_endpoint_names_url():
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(RuntimeError, match=rf"{URL}: ConnectError"):
        list(client_answering(refuse).generate("a", "b", np.array([1]), SAMPLING))


def test_closing_the_generator_closes_the_response():
    closed = []

    class Body(httpx.SyncByteStream):
        def __iter__(self):
            yield sse_body(["<|s_1|>"])
            yield sse_body(["<|s_2|>"])

        def close(self) -> None:
            closed.append(True)

    pieces = client_answering(lambda request: httpx.Response(200, stream=Body())).generate(
        "a", "b", np.array([1]), SAMPLING
    )
    next(pieces)
    pieces.close()
    assert closed == [True]


@pytest.fixture(scope="module")
def prompter(tmp_path_factory) -> CosyVoice2Prompt:
    llm_dir = write_cosyvoice2_llm(
        tmp_path_factory.mktemp("llm") / "cosyvoice2_llm", "tiny", qwen2lm_state_dict(), 0
    )
    return CosyVoice2Prompt.from_llm_dir(Path(llm_dir))


def test_service_uses_generate_chat_with_texts_tokens_and_budget(prompter):
    calls = []

    def generate(*args):
        raise AssertionError("the prompt-ids path must not run")

    def generate_chat(reference_text, target_text, speech_tokens, sampling, streaming):
        calls.append((reference_text, target_text, speech_tokens.tolist(), sampling, streaming))
        yield np.array([ORIGINAL_VOCAB_SIZE + 4, ORIGINAL_VOCAB_SIZE + 9], dtype=np.int32)

    def token2wav(tokens, voice, offset, finalize, request_id):
        return np.zeros(tokens.size * 960, dtype=np.float32)

    service = CosyVoice2Service(
        prompter,
        tokenize=None,
        embed=None,
        generate=generate,
        token2wav=token2wav,
        default_voice=Voice("cached text ", np.array([3, 1], dtype=np.int32)),
        sampling=prompter.sampling_params(Decoding(max_tokens=100)),
        generate_chat=generate_chat,
    )
    request = CosyVoice2Request(None, "", "hello", TokenBudget(2, 2))
    assert service.synthesize(request, "r1").size == 2 * 960
    reference_text, target_text, tokens, sampling, streaming = calls[0]
    assert (reference_text, target_text, tokens, streaming) == ("cached text ", "hello", [3, 1], False)
    assert (sampling.min_tokens, sampling.max_tokens) == (2, 2)
