"""Bistream in the CosyVoice3 BLS through the session tritonserver (docs/streaming-text.md, "Bistream"): the request
parameter `bistream_session` with the LLM inside Triton (`cosyvoice3_bistream`) and behind our OpenAI-compatible
server (`cosyvoice3_bistream_http`: segment requests over `/v1/completions`), and the speech WebSocket's
`"bistream": true`.

The tiny synthetic CosyVoice3 (CPU, fp32), served from `<|s_0|>` on (cosyvoice3_models: the engines' output
window; upstream's CosyVoice3LM has no text outputs, and the random text rows would win in bistream segments). The audio is checked
against an LLM-level `run_bistream` with CosyVoice3's ids and prompt text (the system part after `<|sos|>`) over
gRPC to the offline engine of the same LLM with the BLS's own seeded sampling: 960 samples a speech token (2 mel
frames of 480).
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_models import TEXT_INBOX
from cosyvoice3_models import (
    BISTREAM_BLS,
    BISTREAM_HTTP_BLS,
    BISTREAM_HTTP_PORT,
    MAX_NEW_TOKENS,
    PREFIX,
    build_cosyvoice3_models,
    checkpoint_root,
    openai_llm_server,
)
from openai_api_process import api_process, zh_voices
from test_bistream_triton import DELTAS, SAMPLES_PER_TOKEN, Bistream, llm_level_tokens, push
from waiting import scaled
from websockets.sync.client import connect

from tritontts.cosyvoice2.bistream import BistreamTokens
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt
from tritontts.openai_api.stream_ws import STREAM_PATH

TRITON_MODELS = [build_cosyvoice3_models]
pytestmark = pytest.mark.slow
BLS, HTTP_BLS = BISTREAM_BLS, BISTREAM_HTTP_BLS
LLM = PREFIX + "speech_llm_offline"
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder", "speech_llm", "speech_llm_offline")
UNLOAD_AFTER = (PREFIX + "speech_llm", PREFIX + "speech_llm_offline", BLS, HTTP_BLS)  # this module's own


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*(PREFIX + leaf for leaf in LEAVES), BLS, HTTP_BLS, TEXT_INBOX)


@pytest.fixture
def client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def root(server):
    return checkpoint_root(server.repo.parent / "data" / build_cosyvoice3_models.__name__)


@pytest.fixture(scope="module")
def expected(server, root) -> list[int]:
    """The BLS's speech tokens for DELTAS in cross_lingual (prompt text: the default system part alone)."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        prompter = CosyVoice3Prompt.from_llm_dir(root / LLM_DIR)
        return llm_level_tokens(
            client, LLM, prompter, BistreamTokens.cosyvoice3(), DELTAS, "", MAX_NEW_TOKENS
        )
    finally:
        client.close()


def speak(client, model: str) -> tuple[np.ndarray, int]:
    """DELTAS pushed one by one to a bistream request of `model`: all its audio, and how many samples came
    before the final push."""
    stream = Bistream(client, model=model)
    try:
        assert stream.next().size == 0  # the inbox exists: push from now on
        for delta in DELTAS[:-1]:
            push(client, stream.session, delta)
            time.sleep(0.05)
        chunks = [stream.next()]
        while chunks[-1].size == 0:  # CosyVoice3 sends the samples past what it sent: a chunk may hold none
            chunks.append(stream.next())
        early = sum(c.size for c in chunks)
        push(client, stream.session, DELTAS[-1], final=True)
        chunks += stream.rest()
    finally:
        client.stop_stream()
    return np.concatenate(chunks), early


def test_cosyvoice3_speaks_before_the_final_push_the_schedules_tokens(server, client, expected):
    samples, early = speak(client, BLS)
    assert 18 <= len(expected) and early > 0
    assert samples.size == len(expected) * SAMPLES_PER_TOKEN
    assert 0 < np.abs(samples).max() <= 1.0
    with pytest.raises(Exception, match="session_id"):  # the inbox is gone with the request
        push(client, "0" * 32, "more")


def test_disaggregated_cosyvoice3_speaks_the_same_over_completions(server, client, root, expected, tmp_path):
    """`llm_api_base`: each segment is a streamed /v1/completions request (token-id prompt, stop, logit_bias)
    to our server on the same checkpoint with the same seeded sampling, so the audio is the in-Triton one."""
    with openai_llm_server(root / MODEL_DIR, tmp_path / "llm_server.log", port=BISTREAM_HTTP_PORT):
        over_http, _ = speak(client, HTTP_BLS)
    in_triton, _ = speak(client, BLS)
    assert over_http.size == in_triton.size == len(expected) * SAMPLES_PER_TOKEN
    np.testing.assert_allclose(over_http, in_triton, atol=1e-5)


def test_a_speech_websocket_session_speaks_cosyvoice3_before_input_done(server, tmp_path_factory, prompt_zh):
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--model", f"cosyvoice3={BLS}"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        with connect(
            url.replace("http://", "ws://") + STREAM_PATH, open_timeout=scaled(30), max_size=None
        ) as ws:

            def send(kind: str, **fields) -> None:
                ws.send(json.dumps({"type": kind, **fields}))

            def receive() -> dict | bytes:
                message = ws.recv(timeout=scaled(300))
                return message if isinstance(message, bytes) else json.loads(message)

            # instruct2: the instruction is the system part, no prompt speech for the text to cover first
            send("session.config", model="cosyvoice3", voice="zh", stream_audio=True, bistream=True,
                 instructions="用开心的语气说")  # fmt: skip
            created = receive()
            assert created["type"] == "session.created" and created["bistream"] is True, created
            for delta in DELTAS[:-1]:
                send("input.text", text=delta)
            events, audio = [], bytearray()
            while not audio:  # before input.done
                message = receive()
                if isinstance(message, bytes):
                    audio += message
                else:
                    events.append(message)
            send("input.text", text=DELTAS[-1])
            send("input.done")
            while not (events and events[-1]["type"] == "session.done"):
                message = receive()
                if isinstance(message, bytes):
                    audio += message
                else:
                    events.append(message)
    assert [e["type"] for e in events] == ["audio.start", "audio.done", "session.done"], events
    done = events[1]
    assert done["error"] is False and done["text"] == "".join(DELTAS)
    samples = np.frombuffer(bytes(audio), dtype=np.int16)
    assert samples.size == done["samples"] > 0 and samples.size % SAMPLES_PER_TOKEN == 0
