"""Bistream over `WS /v1/audio/speech/stream` (session.config `"bistream": true`; docs/streaming-text.md): the API
in front of the session tritonserver's tiny CosyVoice2 starts one bistream BLS request per utterance and pushes
every `input.text` delta to `text_inbox`; audio comes before `input.done`. A family without bistream (Spark-TTS)
answers the config with an error and closes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_models import PREFIX, TEXT_INBOX, build_cosyvoice2_models
from openai_api_process import api_process, zh_voices
from reliability_models import wait_engine_idle
from spark_models import build_spark_models
from test_bistream_triton import DELTAS
from waiting import scaled
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tritontts.openai_api.stream_ws import STREAM_PATH
from tritontts.triton.text_inbox import inbox_dir

ROOT = Path(__file__).resolve().parents[1]
TRITON_MODELS = [build_cosyvoice2_models, build_spark_models]
pytestmark = pytest.mark.slow
INSTRUCT = {"instructions": "用开心的语气说"}
"""instruct2: no prompt speech for the text to cover first, so the tiny LLM speaks after 5 text tokens"""
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm")


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*(PREFIX + leaf for leaf in LEAVES), "cosyvoice2", TEXT_INBOX, "spark_tts")


@pytest.fixture(scope="module")
def api(server, tmp_path_factory, prompt_zh):
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices)]
    args += ["--model", "cosyvoice2=cosyvoice2", "--model", "spark-tts=spark_tts"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url.replace("http://", "ws://") + STREAM_PATH


def send(ws: ClientConnection, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def receive(ws: ClientConnection, timeout: float = 300) -> dict | bytes:
    message = ws.recv(timeout=scaled(timeout))
    return message if isinstance(message, bytes) else json.loads(message)


def test_a_bistream_session_speaks_before_input_done(api, server):
    with connect(api, open_timeout=scaled(30), max_size=None) as ws:
        send(
            ws, "session.config", model="cosyvoice2", voice="zh", stream_audio=True, bistream=True, **INSTRUCT
        )
        created = receive(ws)
        assert created["type"] == "session.created" and created["bistream"] is True, created
        for delta in DELTAS[:-1]:
            send(ws, "input.text", text=delta)
        events, audio = [], bytearray()
        while not audio:  # before input.done
            message = receive(ws)
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(message)
                assert message["type"] == "audio.start", message
        send(ws, "input.text", text=DELTAS[-1])
        send(ws, "input.done")
        while not (events and events[-1]["type"] == "session.done"):
            message = receive(ws)
            if isinstance(message, bytes):
                audio += message
            else:
                events.append(message)
        send(ws, "session.close")
        assert receive(ws)["type"] == "session.done"
    kinds = [e["type"] for e in events]
    assert kinds == ["audio.start", "audio.done", "session.done"], events
    start, done = events[0], events[1]
    assert start["bistream"] is True and start["sample_rate"] == 24000
    assert done["error"] is False and done["text"] == "".join(DELTAS)
    samples = np.frombuffer(bytes(audio), dtype=np.int16)
    assert samples.size == done["samples"] > 0 and samples.size % 960 == 0


def test_a_client_that_leaves_mid_utterance_frees_the_engine_and_the_inbox(api, server):
    before = set(os.listdir(inbox_dir())) if inbox_dir().is_dir() else set()
    with connect(api, open_timeout=scaled(30), max_size=None) as ws:
        send(
            ws, "session.config", model="cosyvoice2", voice="zh", stream_audio=True, bistream=True, **INSTRUCT
        )
        assert receive(ws)["type"] == "session.created"
        for delta in DELTAS:
            send(ws, "input.text", text=delta)
        while not isinstance(receive(ws), bytes):
            pass
    wait_engine_idle(server.server, PREFIX + "tensorrt_llm")
    deadline = time.monotonic() + scaled(30)
    while set(os.listdir(inbox_dir())) - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not set(os.listdir(inbox_dir())) - before  # the BLS removed the session's inbox


def test_bistream_on_a_family_without_it_is_an_error_and_a_close(api):
    with connect(api, open_timeout=scaled(30), max_size=None) as ws:
        send(ws, "session.config", model="spark-tts", voice="zh", stream_audio=True, bistream=True)
        error = receive(ws)
        assert error["type"] == "error" and error["param"] == "bistream", error
        assert error["code"] == "bistream_unavailable"
        with pytest.raises(ConnectionClosed) as closed:
            receive(ws, 30)
        assert closed.value.rcvd.code == 1008


def test_the_example_client_speaks_a_text_file_in_bistream(api, tmp_path):
    """examples/ws_client.py --bistream: the text written at a token rate, one utterance, its time to first audio."""
    text = tmp_path / "text.txt"
    text.write_text("".join(DELTAS), encoding="utf-8")
    out = tmp_path / "speech.wav"
    command = [sys.executable, str(ROOT / "examples" / "ws_client.py"), "--url", api, "--model", "cosyvoice2"]
    command += ["--voice", "zh", "--bistream", "--instructions", INSTRUCT["instructions"]]
    command += ["--text-file", str(text), "--out", str(out), "--tokens-per-second", "100"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(300))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ms after the first text" in done.stdout and "'bistream': True" in done.stdout
    samples, rate = soundfile.read(out)
    assert rate == 24000 and samples.size > 0 and samples.size % 960 == 0
