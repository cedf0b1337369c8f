"""Long-form speech through the OpenAI-compatible API: the input normalized and cut by tritontts.text, its
segments synthesized one after another with one voice and streamed in order.

In-process first (the app with a stand-in for Triton that records what it is sent): the segments and their order,
normalization on and off, the field's and the limit's 400s, and that the first audio leaves before the last segment
is asked for. Then against the real tritonserver (tiny synthetic Spark-TTS, whose LLM speaks exactly the API's
--max-new-tokens per request): a 3,000-character input streamed raw and as SSE and whole, complete, its first
chunk ahead of the last segment; and the BLS's own `text_normalization` request parameter.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import httpx
import numpy as np
import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from fastapi.testclient import TestClient
from openai_api_process import api_process, decode, zh_voices
from spark_models import SPARK_SERVING, build_spark_models
from triton_stats import success_count, wait_for_counts

from tritontts.openai_api.app import create_app
from tritontts.openai_api.long_form import segment_samples
from tritontts.openai_api.settings import ModelRoute, Settings
from tritontts.openai_api.triton_client import Deployment
from tritontts.text import TextConfig, TextNormalizer, text_segments

TRITON_MODELS = [build_spark_models]
RATE = 16000
TRANSCRIPT = "我有3个苹果。"
PARAGRAPH = (
    "On March 5, 2024, the company sold 1,234 units at $19.99 each, a 12% rise over the year before. "
    "The CEO said the growth came from new markets; she expects sales to double by 2026! "
    "Analysts were not so sure, and several of them pointed to rising costs. "
)
LONG = (PARAGRAPH * 12)[:3000]


# --- in process, Triton stood in for ----------------------------------------------------------------------


class RecordingTriton:
    """Answers every segment with audio whose samples are its number (1, 2, ...) / 100, two chunks a stream."""

    def __init__(self, max_text_length: int) -> None:
        self.max_text_length = max_text_length
        self.sent: list[tuple[str, dict, str | None]] = []
        self.events: list[str] = []

    async def deployment(self, route):
        return Deployment(route, "spark_tts", "spark_tts_offline", max_text_length=self.max_text_length)

    def _record(self, arrays, parameters) -> float:
        reference = arrays.get("reference_text")
        text = arrays["target_text"].reshape(-1)[0].decode()
        self.sent.append(
            (text, dict(parameters or {}), None if reference is None else reference[0][0].decode())
        )
        return len(self.sent) / 100

    async def synthesize(self, deployment, arrays, parameters=None):
        return np.full(300, self._record(arrays, parameters), dtype=np.float32)

    async def stream(self, deployment, arrays, parameters=None):
        value = self._record(arrays, parameters)
        self.events.append(f"open {len(self.sent)}")
        for _ in range(2):
            await asyncio.sleep(0)
            yield np.full(150, value, dtype=np.float32)

    async def server_ready(self):
        return True

    async def close(self):
        pass


@pytest.fixture
def voices(tmp_path):
    rng = np.random.default_rng(0)
    soundfile.write(tmp_path / "zh.wav", (rng.standard_normal(RATE) * 0.1).astype(np.float32), RATE)
    (tmp_path / "zh.txt").write_text(TRANSCRIPT + "\n", encoding="utf-8")
    return tmp_path


def app_client(voices, triton: RecordingTriton, max_input_chars: int = 5000) -> TestClient:
    routes = (ModelRoute("m", ("spark_tts", "spark_tts_offline"), RATE),)
    settings = Settings(routes=routes, voices_dir=voices, max_input_chars=max_input_chars)
    return TestClient(create_app(settings, triton))


def body(**fields) -> dict:
    return {"model": "m", "voice": "zh", "input": LONG, "response_format": "pcm", **fields}


def pcm_values(data: bytes) -> np.ndarray:
    return np.round(np.frombuffer(data, dtype="<i2") / 32768.0 * 100).astype(int)


@pytest.mark.parametrize("normalize", [True, False])
def test_segments_in_order_with_one_voice_normalized_or_not(voices, normalize):
    triton = RecordingTriton(max_text_length=200)
    with app_client(voices, triton) as client:
        response = client.post("/v1/audio/speech", json=body(text_normalization=normalize))
    assert response.status_code == 200, response.text
    config = TextConfig(normalize=normalize, max_segment_chars=200)
    expected = list(text_segments(LONG, TextNormalizer(), config))
    assert [text for text, _, _ in triton.sent] == expected and len(expected) >= 10
    assert all(len(text) <= 200 for text in expected)
    assert all(params["text_normalization"] is False for _, params, _ in triton.sent)  # not normalized twice
    assert {reference for _, _, reference in triton.sent} == {"我有三个苹果。" if normalize else TRANSCRIPT}
    spoken = " ".join(expected)
    assert ("twelve percent" in spoken and "12%" not in spoken) if normalize else "12%" in spoken
    values = pcm_values(response.content)  # the segments' audio end to end, in order
    assert values.tolist() == [v for i in range(1, len(expected) + 1) for v in [i] * 300]


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_stream_carries_every_segment_in_order(voices, stream_format):
    triton = RecordingTriton(max_text_length=200)
    with app_client(voices, triton) as client:
        response = client.post("/v1/audio/speech", json=body(stream_format=stream_format))
    assert response.status_code == 200, response.text
    if stream_format == "sse":
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1]["type"] == "speech.audio.done"
        data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
        assert events[-1]["usage"]["input_tokens"] == len(LONG)
    else:
        data = response.content
    count = len(triton.sent)
    assert count >= 10 and pcm_values(data).tolist() == [v for i in range(1, count + 1) for v in [i] * 300]


def test_the_first_audio_leaves_before_the_next_segment_is_asked_for():
    async def run() -> list[str]:
        triton = RecordingTriton(1000)
        texts = iter(["two", "three", "four"])

        async def next_segment():
            triton.events.append("next segment")
            return next(texts, None)

        def open_stream(text):
            return triton.stream(None, {"target_text": np.array([[text.encode()]], dtype=object)})

        first_stream = triton.stream(None, {"target_text": np.array([[b"one"]], dtype=object)})
        first = await anext(first_stream)
        async for piece in segment_samples(first, first_stream, 0, next_segment, open_stream):
            triton.events.append(f"audio {round(piece[0] * 100)}" if piece.size else "end of segment")
        return triton.events

    events = asyncio.run(run())
    assert events.index("audio 1") < events.index("open 2")  # one segment in flight
    assert [e for e in events if e.startswith("open")] == ["open 1", "open 2", "open 3", "open 4"]
    assert events.index("open 3") > max(i for i, e in enumerate(events) if e == "audio 2")


@pytest.mark.parametrize("value", ["maybe", 2, [], {"on": True}])
def test_a_bad_text_normalization_is_a_400_naming_it(voices, value):
    with app_client(voices, RecordingTriton(1000)) as client:
        response = client.post("/v1/audio/speech", json=body(input="Hi.", text_normalization=value))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "text_normalization"


def test_multipart_takes_text_normalization_as_a_form_field(voices):
    triton = RecordingTriton(1000)
    with app_client(voices, triton) as client:
        fields = {"model": "m", "voice": "zh", "input": "I have 3 cats.", "response_format": "pcm"}
        response = client.post("/v1/audio/speech", data=fields | {"text_normalization": "false"})
    assert response.status_code == 200 and triton.sent[0][0] == "I have 3 cats."


@pytest.mark.parametrize("text", ["😼9!", "ok :) ;) <3 </3", "...", "\u09ba⨤gᚙ😨🍑ᅥW 1🙙f" * 300, "x" * 4000])
def test_odd_inputs_are_served(voices, text):
    triton = RecordingTriton(200)
    with app_client(voices, triton) as client:
        response = client.post("/v1/audio/speech", json=body(input=text))
    assert (
        response.status_code == 200 and triton.sent
    )  # a word longer than a segment goes whole: the BLS judges


def test_input_past_the_limit_is_a_400_naming_input_and_the_limit(voices):
    with app_client(voices, RecordingTriton(1000), max_input_chars=3000) as client:
        response = client.post("/v1/audio/speech", json=body(input="x" * 3001))
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input" and "3000" in error["message"]


# --- against the real tritonserver ------------------------------------------------------------------------

TOKENS = 20  # the API's --max-new-tokens: every segment speaks exactly this many tokens (320 samples each)
SEGMENT_SAMPLES = TOKENS * 320
MAX_TEXT_LENGTH = 300  # spark_models' BLS
MAX_INPUT = 5000


@pytest.fixture(scope="module")
def triton_server(triton):
    return triton.load(*SPARK_SERVING)


@pytest.fixture(scope="module")
def api(triton_server, tmp_path_factory, prompt_zh):
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", triton_server.grpc_url, "--voices-dir", str(voices)]
    args += [
        f"--max-new-tokens={TOKENS}",
        f"--max-input-chars={MAX_INPUT}",
        "--model",
        "spark-tts=spark_tts,spark_tts_offline",
    ]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        with httpx.Client(base_url=url, timeout=300) as session:
            warm_up = {"model": "spark-tts", "voice": "zh", "input": LONG[:200], "response_format": "pcm"}
            answer = session.post("/v1/audio/speech", json=warm_up)
            assert answer.status_code == 200, answer.text  # first-call costs
            yield session


def served_segments() -> int:
    return len(list(text_segments(LONG, TextNormalizer(), TextConfig(max_segment_chars=MAX_TEXT_LENGTH))))


def speech(**fields) -> dict:
    return {"model": "spark-tts", "voice": "zh", "input": LONG, "response_format": "pcm", **fields}


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_a_long_input_streams_its_segments_first_audio_early(api, triton_server, stream_format):
    count = served_segments()
    assert count >= 8
    before = success_count(triton_server, "spark_tts")
    start = time.perf_counter()
    pieces, first_at, served_at_first = [], None, None
    with api.stream("POST", "/v1/audio/speech", json=speech(stream_format=stream_format)) as response:
        assert response.status_code == 200
        for line in response.iter_lines() if stream_format == "sse" else [None]:
            if line is not None and not line.startswith("data: "):
                continue
            if line is None:
                for piece in response.iter_raw():
                    if piece and first_at is None:
                        first_at, served_at_first = (
                            time.perf_counter(),
                            success_count(triton_server, "spark_tts"),
                        )
                    pieces.append(piece)
                break
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                if first_at is None:
                    first_at, served_at_first = time.perf_counter(), success_count(triton_server, "spark_tts")
                pieces.append(base64.b64decode(event["audio"]))
    end = time.perf_counter()
    assert served_at_first - before < count - 1  # the first audio did not wait for the later segments
    assert first_at - start < (end - start) / 2
    assert sum(len(p) for p in pieces) == count * SEGMENT_SAMPLES * 2  # every segment's audio, whole
    wait_for_counts(triton_server, {"spark_tts": before + count}, count=success_count)  # one request each


def test_a_long_input_as_one_file_joins_its_segments(api, triton_server):
    before = success_count(triton_server, "spark_tts_offline")
    response = api.post("/v1/audio/speech", json=speech(response_format="wav"))
    assert response.status_code == 200
    samples, rate = decode(response.content, "wav", RATE)
    assert rate == RATE and samples.size == served_segments() * SEGMENT_SAMPLES
    wait_for_counts(triton_server, {"spark_tts_offline": before + served_segments()}, count=success_count)


def test_past_the_limit_a_400_names_input_and_the_limit(api):
    response = api.post("/v1/audio/speech", json=speech(input=LONG * 2))
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "input" and str(MAX_INPUT) in error["message"]


def test_the_bls_refuses_a_bad_text_normalization_parameter(triton_server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from tritontts.bench import triton_io

    wav = np.zeros(RATE, dtype=np.float32) + 0.01
    arrays = triton_io.request_arrays(wav, TRANSCRIPT, "I have 3 cats.")
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    inputs = triton_io.infer_inputs(grpcclient, arrays)
    with pytest.raises(InferenceServerException) as err:
        client.infer("spark_tts_offline", inputs, parameters={"text_normalization": "maybe"})
    assert "text_normalization" in err.value.message()
    for switch in (True, False):  # a boolean either way is taken
        out = client.infer(
            "spark_tts_offline", inputs, parameters={"text_normalization": switch, "max_new_tokens": 5}
        )
        assert out.as_numpy("waveform").size == 5 * 320
