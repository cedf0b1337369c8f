"""The OpenAI-compatible LLM server (`python -m tritontts.llm.openai_server`) on a tiny synthetic cosyvoice2_llm.

Requests are the ones upstream's DiT BLS sends trtllm-serve; streamed `<|s_N|>` tokens are read with its regex
and compared with the engine run in-process on the same prompt ids and sampling parameters.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from http_service import http_service
from waiting import scaled, wait_until

from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, prompt_text
from tritontts.cosyvoice2.tokens import SPEECH_STOP_TOKENS
from tritontts.llm.engine import LLMEngine
from tritontts.llm.openai_server.app import ServedModel, create_app
from tritontts.llm.openai_server.chat_template import ChatTemplate
from tritontts.llm.openai_server.detokenize import TextStream
from tritontts.llm.openai_server.generation import EngineStream
from tritontts.llm.sequence import FinishReason, SamplingParams, TokenEvent
from tritontts.spark.prompt import load_llm_tokenizer
from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm
from tritontts.triton.server import free_ports

SPEECH_TOKEN = re.compile(r"<\|s_(\d+)\|>")  # upstream's cosyvoice2_dit forward_llm_async
REFERENCE_TEXT, TARGET_TEXT = "hello ", "world, how are you"
PROMPT_SPEECH = [12, 7, 4000, 6560, 0]
MAX_SEQ_LEN = 256
UPSTREAM_FIELDS = {
    "max_tokens": 60,
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 50,
    "repetition_penalty": 1.1,
    "stop": ["<|eos1|>", "<|eos|>"],
}


def upstream_messages(speech: list[int] = PROMPT_SPEECH) -> list[dict]:
    speech_text = "".join(f"<|s_{t}|>" for t in speech)
    return [
        {"role": "user", "content": f"{REFERENCE_TEXT}{TARGET_TEXT}"},
        {"role": "assistant", "content": speech_text},
    ]


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory) -> Path:
    return write_cosyvoice2_llm(
        tmp_path_factory.mktemp("llm") / "cosyvoice2_llm", "tiny", qwen2lm_state_dict(), 0
    )


@pytest.fixture(scope="module")
def prompt(llm_dir) -> CosyVoice2Prompt:
    return CosyVoice2Prompt.from_llm_dir(llm_dir)


@pytest.fixture(scope="module")
def engine(llm_dir) -> LLMEngine:
    return LLMEngine.from_pretrained(
        llm_dir, device="cpu", max_batch_size=1, max_seq_len=MAX_SEQ_LEN, cuda_graphs=False
    )


@pytest.fixture(scope="module")
def server(llm_dir, tmp_path_factory) -> Iterator[str]:
    log_file = tmp_path_factory.mktemp("llm_server") / "server.log"
    args = [
        *("--model-dir", str(llm_dir), "--device", "cpu", "--max-batch-size", "4"),
        *("--max-seq-len", str(MAX_SEQ_LEN), "--no-cuda-graphs", "--log-level", "warning"),
    ]
    with http_service("tritontts.llm.openai_server", args, log_file, timeout_s=60) as url:
        yield url


def engine_speech(engine: LLMEngine, prompt: CosyVoice2Prompt, ids: list[int], seed: int, max_tokens: int):
    """The engine's own speech tokens, stopping as the server does (at `<|eos1|>`, or at eos2/eos3)."""
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.8,
        top_k=50,
        top_p=0.95,
        repetition_penalty=1.1,
        seed=seed,
        end_id=prompt.ids.end,
    )
    (out,) = engine.generate([ids], params)
    stops = {prompt.tokenizer.token_to_id(t) for t in SPEECH_STOP_TOKENS}
    cut = next((i for i, t in enumerate(out) if t in stops), len(out))
    return prompt.speech_tokens(out[:cut])


def read_upstream_stream(url: str, payload: dict) -> tuple[list[int], list[dict]]:
    """Speech tokens parsed as the DiT BLS parses them, and the SSE chunks."""
    tokens, chunks, buffer = [], [], ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=payload, timeout=60) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :].strip()
            if data == "[DONE]":
                break
            chunks.append(json.loads(data))
            buffer += chunks[-1]["choices"][0]["delta"].get("content") or ""
            while match := SPEECH_TOKEN.search(buffer):
                tokens.append(int(match.group(1)))
                buffer = buffer[match.end() :]
    assert data == "[DONE]"
    return tokens, chunks


def test_chat_template_continues_the_assistant_message(llm_dir, prompt):
    speech = "".join(f"<|s_{t}|>" for t in PROMPT_SPEECH)
    template = ChatTemplate.from_model_dir(llm_dir)
    text = template.render(upstream_messages(), add_generation_prompt=False, continue_final_message=True)
    assert text == prompt_text(REFERENCE_TEXT, TARGET_TEXT) + speech
    ids = prompt.tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == prompt.input_ids(REFERENCE_TEXT, TARGET_TEXT, PROMPT_SPEECH)


def test_text_stream_cuts_at_a_stop_string_split_over_tokens(llm_dir):
    tokenizer = load_llm_tokenizer(llm_dir)
    ids = tokenizer.encode("<|s_1|>ab<|eos|><|s_2|>", add_special_tokens=False).ids
    stream = TextStream(tokenizer, ["<|eos|>"])
    sent = "".join(stream.push([i]) for i in ids)
    assert (sent, stream.stopped) == ("<|s_1|>ab", True)
    whole = TextStream(tokenizer, ["zz"])
    assert "".join(whole.push([i]) for i in ids) + whole.flush() == "<|s_1|>ab<|eos|><|s_2|>"


def test_streamed_speech_tokens_equal_the_engine(server, engine, prompt):
    payload = {"model": "trt_engines_bfloat16", "messages": upstream_messages(), "stream": True, "seed": 7}
    tokens, chunks = read_upstream_stream(server, payload | UPSTREAM_FIELDS)
    ids = prompt.input_ids(REFERENCE_TEXT, TARGET_TEXT, PROMPT_SPEECH)
    assert tokens == engine_speech(engine, prompt, ids, seed=7, max_tokens=60)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


def test_openai_client_chat_stream_and_completions(server, engine, prompt):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused")
    extra = {"top_k": 50, "repetition_penalty": 1.1}
    fields = {k: v for k, v in UPSTREAM_FIELDS.items() if k not in extra}
    stream = client.chat.completions.create(
        model="llm", messages=upstream_messages(), stream=True, seed=3, extra_body=extra, **fields
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    ids = prompt.input_ids(REFERENCE_TEXT, TARGET_TEXT, PROMPT_SPEECH)
    expected = engine_speech(engine, prompt, ids, seed=3, max_tokens=60)
    assert [int(n) for n in SPEECH_TOKEN.findall(text)] == expected

    completion = client.completions.create(
        model="llm",
        prompt=ids,
        max_tokens=20,
        seed=5,
        stop=list(SPEECH_STOP_TOKENS),
        extra_body=extra,
        temperature=0.8,
        top_p=0.95,
    )
    expected = engine_speech(engine, prompt, ids, seed=5, max_tokens=20)
    assert [int(n) for n in SPEECH_TOKEN.findall(completion.choices[0].text)] == expected
    assert completion.usage.prompt_tokens == len(ids)
    assert completion.usage.completion_tokens == len(expected)
    assert client.models.list().data[0].id == "cosyvoice2_llm"


def test_four_concurrent_streams_complete(server):
    def run(seed: int) -> tuple[list[int], list[dict]]:
        payload = {"messages": upstream_messages(), "stream": True, "seed": seed}
        return read_upstream_stream(server, payload | UPSTREAM_FIELDS | {"max_tokens": 30})

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, range(4)))
    for tokens, chunks in results:
        assert 0 < len(tokens) <= 30 and all(0 <= t < 6561 for t in tokens)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": upstream_messages(), "temperature": -1}, "temperature"),
        ("/v1/chat/completions", {"messages": upstream_messages(), "top_p": 1.5}, "top_p"),
        ("/v1/chat/completions", {"messages": upstream_messages(), "n": 2}, "n"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"max_tokens": 5}, "messages"),
        ("/v1/completions", {"prompt": [10**9], "max_tokens": 5}, "prompt"),
        ("/v1/completions", {"prompt": list(range(MAX_SEQ_LEN)), "max_tokens": 5}, "prompt"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ("/v1/completions", {"prompt": "hi", "stop": 5}, "stop"),
    ],
)
def test_bad_fields_give_openai_errors_and_the_server_keeps_serving(server, path, body, param):
    response = httpx.post(f"{server}{path}", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)
    # ignore_eos: the tiny random model samples its end token now and then (how often depends on the CPU's kernels)
    good = {"prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    ok = httpx.post(f"{server}/v1/completions", json=good, timeout=30)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "length"


def test_a_client_that_leaves_mid_stream_does_not_stop_the_server(server):
    payload = {"prompt": "hi", "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=payload, timeout=30) as response:
        first = next(line for line in response.iter_lines() if line.startswith("data: "))
    assert json.loads(first[6:])["object"] == "text_completion"
    ok = httpx.post(f"{server}/v1/completions", json={"prompt": "hi", "max_tokens": 3}, timeout=30)
    assert ok.json()["usage"]["completion_tokens"] == 3


class RecordingEngine:
    def __init__(self) -> None:
        self.callbacks, self.cancelled = {}, []

    def add_request(self, prompt_ids, params, on_tokens, request_id):
        self.callbacks[request_id] = on_tokens
        return request_id

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)


def test_a_second_stop_id_ends_the_stream_and_cancels_the_request():
    async def scenario() -> tuple[list, list]:
        engine = RecordingEngine()
        stream = EngineStream(engine, 9, [1], SamplingParams(min_tokens=1, end_id=100), frozenset({101}))
        engine.callbacks[9](TokenEvent(9, [101]))
        engine.callbacks[9](TokenEvent(9, [5, 101, 6]))
        engine.callbacks[9](TokenEvent(9, [], FinishReason.CANCELLED))
        return [(c.token_ids, c.finish_reason) async for c in stream.chunks()], engine.cancelled

    chunks, cancelled = asyncio.run(scenario())
    assert chunks == [([101], None), ([5], "stop")]
    assert cancelled == [9]


@pytest.fixture(scope="module")
def in_process_server(llm_dir) -> Iterator[tuple[str, LLMEngine]]:
    engine = LLMEngine.from_pretrained(
        llm_dir, device="cpu", max_batch_size=2, max_seq_len=4096, cuda_graphs=False
    )
    (port,) = free_ports(1)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(ServedModel.from_model_dir(engine, llm_dir)), port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + scaled(30)
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the in-process server did not start"
        time.sleep(0.05)
    yield url, engine
    server.should_exit = True
    thread.join(timeout=15)


def wait_for(condition, what: str, seconds: float = 30):
    return wait_until(condition, bool, what, timeout=seconds, interval=0.02)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_goes_away_cancels_its_engine_request(in_process_server, stream):
    url, engine = in_process_server
    body = json.dumps({"prompt": "hi", "max_tokens": 4000, "stream": stream, "ignore_eos": True}).encode()
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as connection:
        head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        connection.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        (seq,) = wait_for(lambda: list(engine.scheduler.running), "the request to run")
    wait_for(lambda: seq.finish_reason is not None, "the request to finish")
    assert seq.finish_reason == FinishReason.CANCELLED
    assert len(seq.output_ids) < 4000
