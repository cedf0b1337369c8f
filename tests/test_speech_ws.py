"""Streaming text in over `WS /v1/audio/speech/stream` (docs/streaming-text.md).

First the sentence cutter alone (tritontts.openai_api.stream_text). Then the API as `python -m
tritontts.openai_api` under uvicorn on loopback, in front of the real tritonserver (tiny synthetic Spark-TTS, whose
LLM speaks exactly the API's --max-new-tokens per request), with the `websockets` client: text arriving word by
word is spoken sentence by sentence, the first sentence's audio before the text ends; every sentence's audio is
complete and in order; `input.done` flushes a trailing partial sentence; whole files per segment; the errors, the
limits and the API key, with the session (and the server) going on where it should.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from openai_api_process import api_process, zh_voices
from reliability_models import wait_engine_idle
from spark_models import SPARK_SERVING, build_spark_models
from triton_stats import success_count, wait_for_counts
from waiting import python_env, scaled
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tritontts.bench import results
from tritontts.openai_api.stream_text import SentenceBuffer
from tritontts.openai_api.stream_ws import STREAM_PATH

TRITON_MODELS = [build_spark_models]
ROOT = Path(__file__).resolve().parents[1]
KEY = "ws-test-key"
RATE = 16000
TOKENS = 60  # the API's --max-new-tokens: every sentence is 60 tokens, streamed in two chunks
SEGMENT_SAMPLES = TOKENS * 320
CONFIG_TIMEOUT, IDLE_TIMEOUT, MAX_MESSAGE = 3, 3, 2048
FIRST = "Hello there, this is the first sentence."
SECOND = "and this one ends without a stop"
WORDS_PER_S = (
    2  # the whole text in 7 s, the first sentence in 3.5: room for a loaded CI machine to speak it first
)
BEARER = {"Authorization": f"Bearer {KEY}"}


# --- the sentence cutter ----------------------------------------------------------------------------------


def cut(
    text: str, granularity: str = "sentence", max_chars: int = 300, step: int = 1
) -> tuple[list[str], str]:
    buffer = SentenceBuffer(granularity, max_chars)
    done = [s for i in range(0, len(text), step) for s in buffer.push(text[i : i + step])]
    return done, buffer.text


def test_a_sentence_is_cut_once_something_follows_its_mark():
    text = 'It costs 3.5 dollars! He said "Hi." Then 你好。我很好！ok? And'
    done, rest = cut(text)
    assert (
        done == ["It costs 3.5 dollars!", 'He said "Hi."', "Then 你好。", "我很好！", "ok?"]
        and rest == " And"
    )
    assert cut("Wait. ")[0] == ["Wait."] and cut("Wait.")[0] == []  # the next character decides
    assert cut("Line one\nLine two")[0] == ["Line one"]


def test_clauses_none_and_a_long_run_without_marks():
    assert cut("Well, I think so: yes. ", "clause")[0] == ["Well,", "I think so:", "yes."]
    assert cut("好的，我们走吧。然后", "clause", step=3) == (["好的，", "我们走吧。"], "然后")
    assert cut("One. Two. ", "none") == ([], "One. Two. ")
    done, rest = cut("one two three four five six seven eight", max_chars=20, step=4)
    assert (
        all(len(s) <= 20 for s in done)
        and " ".join([*done, rest]).split() == "one two three four five six seven eight".split()
    )
    buffer = SentenceBuffer("none")
    buffer.push("... ")
    assert buffer.flush() == ""  # nothing to say


# --- against the real tritonserver ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def triton_server(triton):
    return triton.load(*SPARK_SERVING)


@pytest.fixture(scope="module")
def api(triton_server, tmp_path_factory, prompt_zh):
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", triton_server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += [f"--max-new-tokens={TOKENS}", "--model", "spark-tts=spark_tts,spark_tts_offline"]
    args += [f"--ws-config-timeout={CONFIG_TIMEOUT}", f"--ws-idle-timeout={IDLE_TIMEOUT}"]
    args += [f"--ws-max-message-bytes={MAX_MESSAGE}"]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


def open_stream(api: str, query: str = "", headers: dict | None = BEARER) -> ClientConnection:
    url = api.replace("http://", "ws://") + STREAM_PATH + query
    return connect(url, additional_headers=headers, open_timeout=scaled(30), max_size=None)


def send(ws: ClientConnection, kind: str, **fields) -> None:
    ws.send(json.dumps({"type": kind, **fields}))


def receive(ws: ClientConnection, timeout: float = 120) -> dict | bytes:
    message = ws.recv(timeout=scaled(timeout))
    return message if isinstance(message, bytes) else json.loads(message)


def until(ws: ClientConnection, kind: str) -> list[dict | bytes]:
    """Messages up to and with the first of type `kind`."""
    seen = [receive(ws)]
    while isinstance(seen[-1], bytes) or seen[-1]["type"] != kind:
        seen.append(receive(ws))
    return seen


def closed_with(ws: ClientConnection) -> int:
    with pytest.raises(ConnectionClosed) as closed:
        receive(ws, 30)
    return closed.value.rcvd.code


def configure(ws: ClientConnection, **fields) -> dict:
    send(ws, "session.config", **{"model": "spark-tts", "voice": "zh", **fields})
    created = receive(ws)
    assert created["type"] == "session.created", created
    return created


def segments(messages: list[dict | bytes]) -> list[tuple[dict, list[bytes], dict]]:
    """(audio.start, its binary frames, audio.done) per segment, checking they nest in order."""
    out, frames, start = [], [], None
    for message in messages:
        if isinstance(message, bytes):
            assert start is not None
            frames.append(message)
        elif message["type"] == "audio.start":
            assert start is None
            start, frames = message, []
        elif message["type"] == "audio.done":
            assert start is not None and message["sentence_index"] == start["sentence_index"]
            out.append((start, frames, message))
            start = None
    return out


def test_sentences_are_spoken_as_they_complete_before_the_text_ends(api, triton_server):
    before = success_count(triton_server, "spark_tts")
    with open_stream(api) as ws:
        created = configure(ws, stream_audio=True, split_granularity="sentence")
        assert created["format"] == "pcm" and created["sample_rate"] == RATE
        words = f"{FIRST} {SECOND}".split(" ")
        first_words = len(FIRST.split(" ")) + 1  # the sentence is complete once the next word starts
        for i, word in enumerate(words[:first_words]):
            send(ws, "input.text", text=word if i == 0 else " " + word)
        early = [receive(ws), receive(ws)]  # before the rest of the text is even sent
        assert early[0]["type"] == "audio.start" and early[0]["sentence_index"] == 0
        assert "first sentence" in early[0]["sentence_text"] and isinstance(early[1], bytes)
        for word in words[first_words:]:
            send(ws, "input.text", text=" " + word)
        send(ws, "input.done")  # the second sentence has no stop: input.done flushes it
        rest = until(ws, "session.done")
        spoken = segments(early + rest)
        assert rest[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
        assert [s["sentence_index"] for s, _, _ in spoken] == [0, 1]
        assert "without a stop" in spoken[1][0]["sentence_text"]
        for _, frames, done in spoken:
            assert len(frames) >= 2  # streamed in pieces
            assert sum(map(len, frames)) == done["total_bytes"] == 2 * done["samples"] == 2 * SEGMENT_SAMPLES
            assert done["duration"] == round(SEGMENT_SAMPLES / RATE, 3) and done["error"] is False
        send(ws, "session.close")
        assert receive(ws) == {
            "type": "session.done",
            "utterance_index": 1,
            "total_sentences": 0,
            "closed": True,
        }
        assert closed_with(ws) == 1000
    counts = wait_for_counts(triton_server, {"spark_tts": before + 2}, count=success_count)
    assert counts["spark_tts"] == before + 2  # one request per sentence


def test_whole_files_per_input_done_with_the_key_in_the_config(api, triton_server):
    with open_stream(api, headers=None) as ws:  # as a browser sends it: its WebSocket sets no headers
        assert configure(ws, api_key=KEY, response_format="wav")["split_granularity"] == "none"
        send(ws, "input.text", text="One sentence here. Another one here.")
        send(ws, "input.done")
        first = segments(until(ws, "session.done"))
        send(ws, "input.text", text="A third.")
        send(ws, "session.close")  # flushes what is buffered, then ends the session
        second = until(ws, "session.done")
        assert second[-1]["closed"] is True and second[-1]["utterance_index"] == 1
        assert closed_with(ws) == 1000
    assert len(first) == 1 and "Another one here" in first[0][0]["sentence_text"]  # none: one request
    for start, frames, done in [*first, *segments(second)]:
        assert len(frames) == 1 and start["format"] == "wav"
        samples, rate = soundfile.read(io.BytesIO(frames[0]))
        assert rate == RATE and samples.size == done["samples"] == SEGMENT_SAMPLES


def error_of(ws: ClientConnection) -> dict:
    message = receive(ws, 30)
    assert message["type"] == "error", message
    return message


@pytest.mark.parametrize(
    "message, param, code",
    [
        ("{not json", None, "invalid_json"),
        ("[1, 2]", None, "invalid_json"),
        (b"\x00\x01", None, "invalid_message"),
        ('{"text": "no type"}', "type", "missing_required_parameter"),
        ('{"type": "input.shout"}', "type", "unknown_type"),
        ('{"type": "input.text", "text": "early"}', "type", "missing_config"),
        ('{"type": "session.config", "model": "spark-tts", "voice": "nobody"}', "voice", "voice_not_found"),
        ('{"type": "session.config", "model": "nope", "voice": "zh"}', "model", "model_not_found"),
        ('{"type": "session.config", "voice": "zh", "split_granularity": "word"}', "split_granularity", None),
        ('{"type": "session.config", "voice": "zh", "stream_audio": "maybe"}', "stream_audio", None),
        (
            '{"type": "session.config", "voice": "zh", "stream_audio": true, "response_format": "mp3"}',
            "response_format",
            None,
        ),
        ('{"type": "session.config", "voice": "zh", "speed": 9}', "speed", None),
    ],
)
def test_a_bad_message_gets_an_error_and_closes_the_session(api, message, param, code):
    with open_stream(api) as ws:
        ws.send(message)
        error = error_of(ws)
        assert error["param"] == param and (code is None or error["code"] == code), error
        assert closed_with(ws) == 1008
    with open_stream(api) as ws:  # the server goes on
        configure(ws)
        send(ws, "session.close")
        assert receive(ws)["closed"] is True


@pytest.mark.parametrize(
    "message, param, code",
    [
        ({"type": "input.text", "text": "x" * (MAX_MESSAGE + 1)}, None, "message_too_large"),
        ({"type": "input.text", "text": 5}, "text", None),
        ({"type": "session.config", "voice": "zh"}, None, "config_already_set"),
    ],
)
def test_a_bad_message_after_the_config_closes_the_session(api, message, param, code):
    with open_stream(api) as ws:
        configure(ws)
        ws.send(json.dumps(message))
        error = error_of(ws)
        assert (param is None or error["param"] == param) and (code is None or error["code"] == code), error
        assert closed_with(ws) == 1008


def test_session_close_without_text(api):
    with open_stream(api) as ws:
        configure(ws)
        send(ws, "session.close")
        assert receive(ws) == {
            "type": "session.done",
            "utterance_index": 0,
            "total_sentences": 0,
            "closed": True,
        }
        assert closed_with(ws) == 1000


def test_without_a_config_in_time_the_session_closes(api):
    with open_stream(api) as ws:
        assert error_of(ws)["code"] == "config_timeout"
        assert closed_with(ws) == 1008


def test_an_idle_session_closes(api):
    with open_stream(api) as ws:
        configure(ws)
        assert error_of(ws)["code"] == "idle_timeout"
        assert closed_with(ws) == 1000


@pytest.mark.parametrize(
    "headers, query, config_key",
    [
        ({"Authorization": "Bearer wrong"}, "", None),  # refused before any message
        ({"Authorization": f"Basic {KEY}"}, "", None),
        (None, "", "wrong"),
        (None, "", None),
        (None, f"?api_key={KEY}", None),  # not read: URLs end up in access logs
    ],
)
def test_a_wrong_or_missing_key_is_refused(api, headers, query, config_key):
    with open_stream(api, query, headers) as ws:
        if headers is None:
            send(ws, "session.config", voice="zh", **({"api_key": config_key} if config_key else {}))
        error = error_of(ws)
        assert error["code"] == "invalid_api_key" and "Bearer" in error["message"]
        assert closed_with(ws) == 1008
    assert httpx.get(f"{api}/health").status_code == 200  # the server keeps serving


@pytest.mark.reliability
def test_a_client_leaving_mid_utterance_frees_its_engine_slot(api, triton_server):
    with open_stream(api) as ws:
        configure(ws, stream_audio=True)
        send(ws, "input.text", text=" ".join([FIRST, SECOND] * 4))
        send(ws, "input.done")
        assert receive(ws)["type"] == "audio.start"
    wait_engine_idle(triton_server.server, "tensorrt_llm")
    with open_stream(api) as ws:  # and the server goes on
        configure(ws)
        send(ws, "session.close")
        assert receive(ws)["closed"] is True


def test_a_client_leaving_mid_sentence_and_the_example_client(api, tmp_path):
    with open_stream(api) as ws:
        configure(ws, stream_audio=True)
        send(ws, "input.text", text=FIRST)
        send(ws, "input.done")
        assert receive(ws)["type"] == "audio.start"
    out = tmp_path / "speech.wav"  # the client left mid-sentence; the server serves the next one
    url = api.replace("http://", "ws://") + STREAM_PATH
    command = [sys.executable, str(ROOT / "examples" / "ws_client.py"), "--url", url, "--voice", "zh"]
    text = tmp_path / "text.txt"
    text.write_text(f"{FIRST} {SECOND} after 2 words", encoding="utf-8")
    command += ["--api-key", KEY, "--text-file", str(text), "--out", str(out), "--tokens-per-second", "100"]
    command += ["--no-text-normalization"]  # the digit reaches the server as written
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(120), env=python_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ms after the first text" in done.stdout
    assert "after 2 words" in done.stdout and "two words" not in done.stdout
    samples, rate = soundfile.read(out)
    assert rate == RATE and samples.size == 2 * SEGMENT_SAMPLES  # two sentences, each whole


def test_the_time_to_first_audio_benchmark_writes_schema_rows(api, tmp_path):
    """scripts/bench_ws_ttfa.py: one then two sessions at once, each the whole text as it is written; a row per
    level in the results schema, every session with audio, its first audio before the text ended."""
    out = tmp_path / "ttfa.json"
    url = api.replace("http://", "ws://") + STREAM_PATH
    command = [
        sys.executable,
        str(ROOT / "scripts" / "bench_ws_ttfa.py"),
        "--url",
        url,
        "--model",
        "spark-tts",
    ]
    command += [
        "--voice",
        "zh",
        "--api-key",
        KEY,
        "--text",
        f"{FIRST} {SECOND}",
        "--tokens-per-second",
        str(WORDS_PER_S),
    ]
    command += [
        "--concurrency",
        "1,2",
        "--rounds",
        "1",
        "--warmup",
        "0",
        "--commit",
        "0123abc",
        "--output",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=scaled(300), env=python_env())
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    assert results.validate(data, out.name) == []
    assert KEY not in out.read_text()
    rows = data["headline"]
    assert [(r["concurrency"], r["mode"]) for r in rows] == [
        (1, "websocket sentence"),
        (2, "websocket sentence"),
    ]
    written_s = len(f"{FIRST} {SECOND}".split()) / WORDS_PER_S
    for level in data["levels"]:
        assert level["failed"] == 0 and len(level["first_audio_ms"]["all"]) == level["concurrency"]
        assert level["audio_seconds"] == pytest.approx(level["concurrency"] * 2 * SEGMENT_SAMPLES / RATE)
        assert (
            0 < level["first_audio_ms"]["p50"] < written_s * 1e3
        )  # the first sentence spoke before the rest came
