"""The OpenAI-compatible speech API with uvicorn on loopback in front of the real tritonserver (tiny synthetic
Spark-TTS), called with the official `openai` client and with raw HTTP."""

from __future__ import annotations

import base64
import io
import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile
import tritonclient.http
import tritonclient.utils
from conftest import PROMPT_ZH_TEXT, TRITON_MODELS_DIR
from openai_api_process import api_process, decode
from spark_models import MAX_NEW_TOKENS, SPARK_SERVING, build_spark_models
from triton_stats import assert_counts, success_count

from tritontts.openai_api.encode import StreamEncoder, streaming_wav_header
from tritontts.openai_api.settings import parse_model_spec
from tritontts.streaming import StreamCrossfader, crossfade_concat
from tritontts.triton.server import free_ports

TRITON_MODELS = [build_spark_models]
KEY = "test-key"
RATE = 16000
TOKENS = 60  # the API's --max-new-tokens: two streamed chunks (50 tokens, then 5 overlapping + 10)
SAMPLES = TOKENS * 320  # the synthetic LLM never stops: every request is TOKENS long
FORMATS = ["wav", "pcm", "flac", "mp3", "opus"]
FIRST_CHUNK_TOKENS, OVERLAP_SAMPLES = (
    50,
    1600,
)  # spark_models' streaming schedule: 1.0 s first chunk, 0.1 s overlap
MP3_SLACK = (
    0.15 * RATE
)  # a streamed MP3 keeps the encoder's delay and padding (its LAME tag comes at the end)
MAX_INPUT = 500  # the API's limit; the BLS's max_text_length is 300
MODELS = [
    "spark-tts=spark_tts,spark_tts_offline",
    "spark-offline=spark_tts_offline",
    "spark-stream=spark_tts",
]


@pytest.fixture(scope="module")
def triton_server(triton):
    return triton.load(*SPARK_SERVING)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory, prompt_zh):
    directory = tmp_path_factory.mktemp("voices")
    shutil.copy(prompt_zh, directory / "zh.wav")
    (directory / "zh.txt").write_text(PROMPT_ZH_TEXT + "\n", encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def api(triton_server, voices_dir, tmp_path_factory):
    assert FIRST_CHUNK_TOKENS < TOKENS < MAX_NEW_TOKENS  # streams have two chunks; the BLS accepts the budget
    args = ["--triton-url", triton_server.grpc_url, "--voices-dir", str(voices_dir), "--api-key", KEY]
    args += [
        f"--max-new-tokens={TOKENS}",
        f"--max-input-chars={MAX_INPUT}",
        "--max-request-bytes=20000",
        "--max-upload-bytes=500000",
    ]
    for spec in MODELS:
        args += ["--model", spec]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def http(api):
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as session:
        yield session


def assert_audio(data: bytes, response_format: str, streamed: bool = False) -> None:
    samples, rate = decode(data, response_format, RATE)
    assert rate == RATE
    if response_format == "mp3" and streamed:
        assert SAMPLES <= samples.size <= SAMPLES + MP3_SLACK
    else:
        assert samples.size == SAMPLES
    assert 0 < np.abs(samples).max() <= 1.0


def assert_error(response: httpx.Response, status: int, param: str | None, code: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")


def speech(**fields) -> dict:
    return {"model": "spark-tts", "input": "Hello.", "voice": "zh", **fields}


# --- without Triton ---------------------------------------------------------------------------------------


def test_stream_crossfader_joins_chunks_as_they_arrive():
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal(n).astype(np.float32) for n in (16000, 32000, 24000)]
    joiner = StreamCrossfader(1600)
    pieces = [joiner.push(c) for c in chunks] + [joiner.finish()]
    fade = np.linspace(0.0, 1.0, 1600, dtype=np.float32)
    c0, c1, c2 = chunks
    expected = np.concatenate(
        [
            c0[:-1600],
            c1[:1600] * fade + c0[-1600:] * (1 - fade),
            c1[1600:-1600],
            c2[:1600] * fade + c1[-1600:] * (1 - fade),
            c2[1600:],
        ]
    )
    np.testing.assert_allclose(np.concatenate(pieces), expected, atol=1e-6)
    np.testing.assert_allclose(crossfade_concat(chunks, 1600), expected, atol=1e-6)
    assert pieces[0].size == 16000 - 1600  # the first chunk goes out at once, less the tail to fade


def test_streamed_wav_has_an_unknown_length_header_then_pcm():
    encoder = StreamEncoder("wav", 24000)
    data = encoder.push(np.full(10, 0.5, dtype=np.float32)) + encoder.finish()
    header = streaming_wav_header(24000)
    assert data[:44] == header and header[4:8] == header[40:44] == b"\xff\xff\xff\xff"
    assert np.frombuffer(data[44:], "<i2").tolist() == [16384] * 10


def test_model_spec():
    route = parse_model_spec("cosy=cosyvoice2,cosyvoice2_offline")
    assert (route.name, route.triton_models, route.sample_rate) == (
        "cosy",
        ("cosyvoice2", "cosyvoice2_offline"),
        24000,
    )
    assert parse_model_spec("x=my_model,sample_rate=22050").sample_rate == 22050
    with pytest.raises(ValueError, match="sample_rate"):
        parse_model_spec("x=my_model")


# --- against Triton ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("response_format", FORMATS)
def test_whole_file_with_the_openai_client(client, response_format):
    response = client.audio.speech.create(
        model="spark-tts", voice="zh", input="Hello.", response_format=response_format
    )
    assert_audio(response.content, response_format)


@pytest.mark.parametrize("response_format", FORMATS)
def test_streamed_audio_with_the_openai_client(client, response_format):
    with client.audio.speech.with_streaming_response.create(
        model="spark-tts", voice="zh", input="Hello.", response_format=response_format, stream_format="audio"
    ) as response:
        assert response.headers["content-type"].startswith("audio/")
        data = b"".join(response.iter_bytes())
    assert_audio(data, response_format, streamed=True)


def test_sse_delivers_chunks_as_they_come(http):
    arrivals, events = [], []
    with http.stream(
        "POST", "/v1/audio/speech", json=speech(response_format="wav", stream_format="sse")
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
                arrivals.append(time.perf_counter())
    kinds = [event["type"] for event in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) >= 3  # the header and first chunk, later chunks, then done
    assert arrivals[0] < arrivals[-2] < arrivals[-1]
    first = base64.b64decode(
        events[0]["audio"]
    )  # the header and Triton's first chunk less the overlap to fade
    assert len(first) == 44 + (FIRST_CHUNK_TOKENS * 320 - OVERLAP_SAMPLES) * 2
    assert events[-1]["usage"]["input_tokens"] == len("Hello.")
    assert_audio(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "wav", streamed=True)


def test_streamed_audio_comes_in_several_pieces(http):
    pieces = []
    with http.stream(
        "POST", "/v1/audio/speech", json=speech(response_format="pcm", stream_format="audio")
    ) as response:
        assert response.status_code == 200
        pieces = [(time.perf_counter(), len(piece)) for piece in response.iter_raw() if piece]
    assert len(pieces) >= 2 and pieces[0][0] < pieces[-1][0]
    assert sum(size for _, size in pieces) == SAMPLES * 2


def test_a_decoupled_only_model_serves_whole_files_and_an_offline_only_model_refuses_streams(http):
    response = http.post("/v1/audio/speech", json=speech(model="spark-stream", response_format="wav"))
    assert response.status_code == 200
    assert_audio(response.content, "wav")
    response = http.post("/v1/audio/speech", json=speech(model="spark-offline", stream_format="audio"))
    assert_error(response, 400, "stream_format", "streaming_unavailable")


@pytest.mark.slow
def test_voices_listed_added_and_cached(http, triton_server, prompt_zh):
    listed = http.get("/v1/audio/voices").json()
    assert listed["object"] == "list" and [v["id"] for v in listed["data"]] == ["zh"]
    assert listed["data"][0]["transcript"] == PROMPT_ZH_TEXT

    wav, rate = soundfile.read(prompt_zh, dtype="float32")
    upload = io.BytesIO()
    soundfile.write(upload, wav[: 3 * rate], rate, format="WAV")  # audio no request has sent before
    files = {"audio_sample": ("fresh.wav", upload.getvalue(), "audio/wav")}
    before = success_count(triton_server, "audio_tokenizer")
    response = http.post(
        # about the clip's first 3 s: the synthetic LLM's length follows the transcript vs the clip
        "/v1/audio/voices",
        data={"name": "fresh", "transcript": PROMPT_ZH_TEXT[:20]},
        files=files,
    )
    assert response.status_code == 201, response.text
    assert (response.json()["id"], response.json()["duration"]) == ("fresh", 3.0)
    assert response.json()["profiles"] == ["spark_tts"]
    assert [v["id"] for v in http.get("/v1/audio/voices").json()["data"]] == ["fresh", "zh"]
    once = {"audio_tokenizer": before + 1}  # the voice's profile, made once at upload
    assert_counts(triton_server, once, count=success_count)

    served = success_count(triton_server, "spark_tts_offline")
    for _ in range(4):
        assert (
            http.post("/v1/audio/speech", json=speech(voice="fresh", response_format="pcm")).status_code
            == 200
        )
    # The requests send the profile: the tokenizer is not called again (test_voice_api.py has more).
    assert_counts(triton_server, once, over={"spark_tts_offline": served + 4}, count=success_count)

    again = http.post("/v1/audio/voices", data={"name": "fresh", "transcript": "x"}, files=files)
    assert_error(again, 409, "name", "voice_exists")


@pytest.mark.parametrize(
    "fields, files, status, param, code",
    [
        ({"name": "bad name!", "transcript": "x"}, True, 400, "name", "invalid_value"),
        ({"name": "nowav", "transcript": "x"}, False, 400, "audio_sample", "missing_required_parameter"),
        ({"name": "notext"}, True, 400, "transcript", "missing_required_parameter"),
        ({"name": "noise", "transcript": "x"}, "not audio", 400, "audio_sample", "invalid_audio"),
        ({"name": "short", "transcript": "x"}, "short", 400, "audio_sample", "invalid_audio"),
        ({"name": "huge", "transcript": "x"}, "huge", 413, None, "request_too_large"),
    ],
)
def test_voice_upload_errors(http, prompt_zh, fields, files, status, param, code):
    content = {True: prompt_zh.read_bytes(), "not audio": b"RIFF not really a wav", "huge": bytes(600_000)}
    if files == "short":
        short = io.BytesIO()
        soundfile.write(short, np.zeros(800, dtype=np.float32), RATE, format="WAV")
        content["short"] = short.getvalue()
    parts = {"audio_sample": ("v.wav", content[files], "audio/wav")} if files else None
    assert_error(http.post("/v1/audio/voices", data=fields, files=parts), status, param, code)


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        (speech(model="tts-9"), 404, "model", "model_not_found"),
        (speech(voice="nobody"), 404, "voice", "voice_not_found"),
        (speech(voice={"id": "nobody"}), 404, "voice", "voice_not_found"),
        (speech(input="  "), 400, "input", "empty_input"),
        (speech(input="x" * (MAX_INPUT + 1)), 400, "input", "string_above_max_length"),
        (speech(input="x" * 301), 400, "input", "triton_invalid_argument"),  # the BLS's own limit
        (speech(input="x" * 301, stream_format="audio"), 400, "input", "triton_invalid_argument"),
        (speech(speed=1.25), 400, "speed", "unsupported_value"),
        (speech(response_format="aac"), 400, "response_format", "unsupported_value"),
        (speech(response_format="ogg"), 400, "response_format", "invalid_value"),
        (speech(stream_format="chunks"), 400, "stream_format", "invalid_value"),
        (speech(instructions="whisper"), 400, "instructions", "unsupported_value"),
        ({"model": "spark-tts", "voice": "zh"}, 400, "input", "missing_required_parameter"),
        (speech(input=42), 400, "input", "invalid_value"),
        ("{not json", 400, None, "invalid_json"),
        (speech(input="x" * 30000), 413, None, "request_too_large"),
    ],
)
def test_speech_errors_have_the_openai_shape(http, body, status, param, code):
    if isinstance(body, str):
        response = http.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    else:
        response = http.post("/v1/audio/speech", json=body)
    assert_error(response, status, param, code)


def test_errors_through_the_openai_client_and_the_service_keeps_serving(client, http):
    with pytest.raises(openai.NotFoundError) as caught:
        client.audio.speech.create(model="spark-tts", voice="nobody", input="Hello.")
    assert caught.value.body["code"] == "voice_not_found"
    chunked = http.post("/v1/audio/speech", content=iter([b"{" + b" " * 15000, b" " * 15000 + b"}"]))
    assert_error(chunked, 413, None, "request_too_large")
    assert_audio(
        client.audio.speech.create(model="spark-tts", voice="zh", input="Hi.", response_format="wav").content,
        "wav",
    )


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}]
)
def test_api_key(api, headers):
    response = httpx.post(f"{api}/v1/audio/speech", json=speech(), headers=headers)
    assert_error(response, 401, None, "invalid_api_key")
    assert httpx.get(f"{api}/v1/audio/voices", headers=headers).status_code == 401
    assert httpx.get(f"{api}/health").status_code == 200


def test_health_reflects_triton(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["triton"]["live"] and health["triton"]["ready"]
    assert health["models"]["spark-tts"] == {
        "ready": True,
        "streaming_model": "spark_tts",
        "offline_model": "spark_tts_offline",
        "sample_rate": RATE,
    }


def test_without_triton_the_api_answers_503_and_keeps_running(voices_dir, tmp_path):
    (dead_port,) = free_ports(1)
    args = ["--triton-url", f"127.0.0.1:{dead_port}", "--voices-dir", str(voices_dir)]
    with api_process(*args, log_file=tmp_path / "api.log", wait_for=503) as url:
        for _ in range(2):
            health = httpx.get(f"{url}/health", timeout=30)
            assert health.status_code == 503 and health.json()["triton"]["live"] is False
            for stream_format in (None, "audio"):
                response = httpx.post(
                    f"{url}/v1/audio/speech", json=speech(stream_format=stream_format), timeout=30
                )
                assert_error(response, 503, None, "triton_unavailable")


BROKEN_MODEL = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise pb_utils.TritonModelException("this model never loads")
"""


def test_a_model_outside_the_routes_that_failed_to_load_leaves_the_api_ready(voices_dir, tmp_path):
    """Triton's strict readiness stays false while any model it holds failed to load; the API's health asks
    whether Triton is live and its own routes' models are ready, so it keeps serving."""
    from conftest import echo_shaped_model, start_explicit_server

    repo = tmp_path / "repo"
    shutil.copytree(TRITON_MODELS_DIR / "infra_echo", repo / "infra_echo")
    echo_shaped_model(repo, "broken", BROKEN_MODEL)
    server = start_explicit_server(repo, tmp_path / "tritonserver.log")
    try:
        client = tritonclient.http.InferenceServerClient(server.http_url)
        client.load_model("infra_echo")
        with pytest.raises(tritonclient.utils.InferenceServerException, match="never loads"):
            client.load_model("broken")
        assert not client.is_server_ready()
        route = ["--model", "echo=infra_echo,sample_rate=16000"]
        args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices_dir), *route]
        with api_process(*args, log_file=tmp_path / "api.log") as url:
            health = httpx.get(f"{url}/health", timeout=30).json()
        client.close()
    finally:
        server.stop(grace_s=15)
    assert health["status"] == "ok", health
    assert health["triton"] | {"url": None} == {"url": None, "live": True, "ready": False}, health
    echo = health["models"]["echo"]
    assert echo["ready"] and echo["offline_model"] == "infra_echo", health


@pytest.mark.slow
def test_sixteen_concurrent_requests(client):
    def one(index: int) -> tuple[bytes, str]:
        response_format = ("wav", "pcm")[index % 2]
        if index % 4 < 2:
            return client.audio.speech.create(
                model="spark-tts", voice="zh", input=f"Number {index}.", response_format=response_format
            ).content, response_format
        with client.audio.speech.with_streaming_response.create(
            model="spark-tts",
            voice="zh",
            input=f"Number {index}.",
            response_format=response_format,
            stream_format="audio",
        ) as response:
            return b"".join(response.iter_bytes()), response_format

    with ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(one, range(16)))
    for data, response_format in results:
        assert_audio(data, response_format, streamed=True)
