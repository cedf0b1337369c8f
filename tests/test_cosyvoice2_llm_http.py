"""CosyVoice2's LLM over a chat-completions endpoint: upstream's payload, `<|s_N|>` parsing, errors,
cancelling, and the service's `generate_chat` seam. The endpoint is an httpx mock transport here;
test_disaggregated.py runs the real server.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from cosyvoice2_models import cached_voice_service, tiny_prompter

from tritontts.cosyvoice2.llm_http import (
    ChatEndpoint,
    ChatSpeechClient,
    SpeechTokenParser,
    speech_chat_payload,
)
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.cosyvoice2.service import CosyVoice2Request
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.service import TokenBudget

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
    return tiny_prompter(tmp_path_factory.mktemp("llm"))


def test_service_uses_generate_chat_with_texts_tokens_and_budget(prompter):
    calls = []

    def generate(*args):
        raise AssertionError("the prompt-ids path must not run")

    def generate_chat(reference_text, target_text, speech_tokens, sampling, streaming):
        calls.append((reference_text, target_text, speech_tokens.tolist(), sampling, streaming))
        yield np.array([ORIGINAL_VOCAB_SIZE + 4, ORIGINAL_VOCAB_SIZE + 9], dtype=np.int32)

    def token2wav(tokens, voice, offset, finalize, request_id):
        return np.zeros(tokens.size * 960, dtype=np.float32)

    service = cached_voice_service(prompter, generate, token2wav, generate_chat=generate_chat)
    request = CosyVoice2Request(None, "", "hello", TokenBudget(2, 2))
    assert service.synthesize(request, "r1").size == 2 * 960
    reference_text, target_text, tokens, sampling, streaming = calls[0]
    assert (reference_text, target_text, tokens, streaming) == ("cached text ", "hello", [3, 1], False)
    assert (sampling.min_tokens, sampling.max_tokens) == (2, 2)


COMPLETION_SAMPLING = SamplingParams(
    max_tokens=15, temperature=0.8, top_k=25, top_p=0.8, seed=42, end_id=9, bad_token_ids=(7, 8)
)


def completion_body(pieces: list[str]) -> bytes:
    events = [{"choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in pieces]
    return "".join([f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]).encode()


def completions_client(handler, url: str = URL, param: str = "llm_api_base") -> ChatSpeechClient:
    transport = httpx.MockTransport(handler)
    return ChatSpeechClient(ChatEndpoint(url, param=param), httpx.Client(transport=transport))


def test_bistream_segments_go_to_completions_beside_the_chat_url():
    assert ChatEndpoint(URL).completions_url == "http://llm.test/v1/completions"
    assert (
        ChatEndpoint("https://h:1/x/v1/chat/completions/?a=1").completions_url
        == "https://h:1/x/v1/completions?a=1"
    )
    with pytest.raises(RuntimeError, match="llm_endpoint: http://llm.test/generate does not end in"):
        _ = ChatEndpoint("http://llm.test/generate").completions_url


def test_complete_sends_a_token_id_segment_and_reads_speech_ids():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), json.loads(request.content)))
        return httpx.Response(200, content=completion_body(["<|s_5|><|s", "_6|>", "", "<|s_7|>"]))

    ids = list(completions_client(handler).complete([1, 2, 3], COMPLETION_SAMPLING, "<|eos3|>", 1000))
    assert ids == [1005, 1006, 1007]
    url, body = seen[0]
    assert url == "http://llm.test/v1/completions"
    assert body == {
        "model": "trt_engines_bfloat16",
        "prompt": [1, 2, 3],
        "max_tokens": 15,
        "temperature": 0.8,
        "top_p": 0.8,
        "top_k": 25,
        "repetition_penalty": 1.0,
        "stop": ["<|eos3|>"],
        "stop_token_ids": [9],
        "ignore_eos": True,
        "logit_bias": {"7": -100, "8": -100},
        "stream": True,
        "seed": 42,
    }


def test_complete_ends_at_a_stop_text_the_server_sends():
    body = completion_body(["<|s_1|><|eo", "s3|><|s_2|>"])
    handler = lambda request: httpx.Response(200, content=body)  # noqa: E731
    assert list(completions_client(handler).complete([1], COMPLETION_SAMPLING, "<|eos3|>", 0)) == [1]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (completion_body(["<|s_1|>hello"]), "not <|s_N|> tokens: 'hello'"),
        (completion_body(["<|s_1|><|s_2"]), "ends inside a token"),
        (b'data: {"error": {"message": "boom"}}\n\ndata: [DONE]\n\n', 'an error event: {"message": "boom"}'),
        (b"data: {oops\n\n", "not JSON"),
        (b'data: {"choices": [{"text": 5}]}\n\n', "text is not a string"),
    ],
)
def test_a_bad_completion_stream_is_an_error_naming_the_parameter(body, message):
    client = completions_client(lambda request: httpx.Response(200, content=body))
    with pytest.raises(
        RuntimeError, match=r"llm_api_base: LLM endpoint http://llm.test/v1/completions: .*"
    ) as caught:
        list(client.complete([1], COMPLETION_SAMPLING, "<|eos3|>", 0))
    assert message in str(caught.value)


def test_a_failed_completions_endpoint_names_the_parameter_and_status():
    client = completions_client(
        lambda request: httpx.Response(404, text="no such route"), param="llm_endpoint"
    )
    with pytest.raises(
        RuntimeError, match="llm_endpoint: LLM endpoint .*/v1/completions answered HTTP 404: no such"
    ):
        list(client.complete([1], COMPLETION_SAMPLING, "<|eos3|>", 0))
