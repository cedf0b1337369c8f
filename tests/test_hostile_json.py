"""Hostile JSON (issue 34) to every endpoint that reads JSON: nesting 5000 deep, a 100000-digit integer, 1e999, NaN,
-Infinity, invalid UTF-8, a lone surrogate, and multipart fields holding such JSON. Each is a 400 whose message names
the problem, and the servers keep serving.

Bodies are parsed before any Triton or engine call, so the apps run in-process (fastapi's TestClient); the real
speech API process over the session tritonserver then takes them all and still serves speech and /health."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from conftest import PROMPT_ZH_TEXT
from fastapi.testclient import TestClient
from openai_api_process import api_process, decode, zh_voices
from spark_models import build_spark_models

from tritontts.json_body import MAX_DEPTH, JsonBodyError, parse_json_object
from tritontts.llm.engine import LLMEngine
from tritontts.llm.openai_server.app import ServedModel
from tritontts.llm.openai_server.app import create_app as create_llm_app
from tritontts.openai_api import Settings, create_app
from tritontts.openai_api.settings import parse_model_spec
from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm
from tritontts.triton.server import free_ports

TRITON_MODELS = [build_spark_models]
DEEP = 5000
ROUTE = "spark-offline=spark_tts_offline"
SPEECH = {"model": "spark-offline", "input": "Hello.", "voice": "zh", "response_format": "pcm"}
COMPLETION = {"prompt": "hi", "max_tokens": 2, "ignore_eos": True}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "ignore_eos": True}
LLM_PATHS = {"/v1/completions": COMPLETION, "/v1/chat/completions": CHAT}


def with_field(good: dict, field: str, literal: bytes) -> bytes:
    """`good` as JSON with `"field": literal` added (the literal as is, valid JSON or not)."""
    return json.dumps(good).encode()[:-1] + f', "{field}": '.encode() + literal + b"}"


def hostile_bodies(good: dict, integer: str, number: str) -> dict[str, tuple[bytes, str]]:
    """Case name: (body, what the error message says); `integer` and `number` are fields that take numbers."""
    return {
        "arrays 5000 deep": (b"[" * DEEP + b"]" * DEEP, f"nests JSON deeper than {MAX_DEPTH} levels"),
        "objects 5000 deep": (b'{"a":' * DEEP + b"1" + b"}" * DEEP, f"deeper than {MAX_DEPTH} levels"),
        "a field 5000 deep": (with_field(good, "user", b"[" * DEEP + b"]" * DEEP), "deeper than"),
        "100000-digit integer": (with_field(good, integer, b"7" * 100_000), "integer of 100000 digits"),
        "1e999": (with_field(good, number, b"1e999"), "number out of range (1e999)"),
        "NaN": (with_field(good, number, b"NaN"), "has NaN"),
        "-Infinity": (with_field(good, number, b"-Infinity"), "has -Infinity"),
        "invalid UTF-8": (with_field(good, "user", b'"\xff\xfe"'), "is not valid UTF-8"),
        "lone surrogate": (with_field(good, "user", b'"\\ud800"'), "lone UTF-16 surrogate (\\ud800)"),
    }


SPEECH_BODIES = hostile_bodies(SPEECH, "speed", "speed")
CASES = list(SPEECH_BODIES)
LLM_BODIES = {path: hostile_bodies(good, "seed", "temperature") for path, good in LLM_PATHS.items()}
FORM_FIELDS = {
    "voice 5000 deep": ({"voice": '{"gender":' + "[" * DEEP + "]" * DEEP + "}"}, "voice", "deeper than"),
    "voice objects 5000 deep": ({"voice": '{"a":' * DEEP + "1" + "}" * DEEP}, "voice", "deeper than"),
    "voice 100000-digit integer": ({"voice": '{"gender":' + "7" * 100_000 + "}"}, "voice", "100000 digits"),
    "voice NaN": ({"voice": '{"gender": "female", "pitch": NaN}'}, "voice", "has NaN"),
    "speed 1e999": ({"speed": "1e999"}, "speed", "finite number"),
    "speed NaN": ({"speed": "NaN"}, "speed", "finite number"),
}


def assert_rejected(response: httpx.Response, says: str, param: str | None = None) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"], error
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert error["code"] == ("invalid_json" if param in (None, "voice") else "invalid_value"), error


def post_form(client: httpx.Client | TestClient, fields: dict, multipart: bool) -> httpx.Response:
    files = {"unused": ("unused.txt", b"", "text/plain")} if multipart else None
    return client.post("/v1/audio/speech", data={**SPEECH, **fields}, files=files)


# --- the parser -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a":' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}",
        b'{"a": "' + b"[{" * DEEP + b'\\"]"}',  # brackets and an escaped quote inside a string
        b'{"low": -9223372036854775808, "high": 18446744073709551615, "big": 1e308, "tiny": 1e-999}',
        b'{"emoji": "\\ud83d\\ude00", "text": "\\\\ud800"}',  # a surrogate pair; an escaped backslash
        '\ufeff{"text": "语音"}'.encode(),
    ],
)
def test_odd_but_valid_objects_are_parsed(raw):
    assert parse_json_object(raw) == json.loads(raw.decode("utf-8-sig"))


@pytest.mark.parametrize(
    "raw, says",
    [
        (b'{"a":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}", "deeper than"),
        (b'{"a": 18446744073709551616}', "integer of 20 digits"),
        (b"", "is empty"),
        (b"[1]", "must be a JSON object, not an array"),
        (b"null", "must be a JSON object, not null"),
        (b"{not json", "is not valid JSON"),
        ('{"a": "é"}'.encode("utf-16"), "is not valid UTF-8"),
    ],
)
def test_limits_of_the_parser(raw, says):
    with pytest.raises(JsonBodyError, match="the request body") as caught:
        parse_json_object(raw)
    assert says in caught.value.message and caught.value.param is None


def test_a_form_field_is_named():
    with pytest.raises(JsonBodyError) as caught:
        parse_json_object('{"gender": Infinity}', "voice")
    assert caught.value.param == "voice" and caught.value.message.startswith("'voice' has Infinity")


# --- the speech API in-process (no Triton behind it) ------------------------------------------------------


@pytest.fixture(scope="module")
def speech_app(tmp_path_factory) -> Iterator[TestClient]:
    (dead_port,) = free_ports(1)
    settings = Settings(
        triton_url=f"127.0.0.1:{dead_port}",
        routes=(parse_model_spec(ROUTE),),
        voices_dir=tmp_path_factory.mktemp("voices"),
    )
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.mark.parametrize("case", CASES)
def test_speech_rejects_hostile_json(speech_app, case):
    body, says = SPEECH_BODIES[case]
    response = speech_app.post("/v1/audio/speech", content=body, headers={"content-type": "application/json"})
    assert_rejected(response, says)


@pytest.mark.parametrize("multipart", [True, False], ids=["multipart", "urlencoded"])
@pytest.mark.parametrize("case", FORM_FIELDS)
def test_speech_rejects_hostile_form_fields(speech_app, case, multipart):
    fields, param, says = FORM_FIELDS[case]
    assert_rejected(post_form(speech_app, fields, multipart), says, param)


def test_voice_uploads_take_no_json(speech_app):
    body, _ = SPEECH_BODIES["arrays 5000 deep"]
    response = speech_app.post("/v1/audio/voices", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_content_type"


# --- the LLM server in-process (a tiny CPU engine) --------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tmp_path_factory) -> Iterator[TestClient]:
    model_dir = write_cosyvoice2_llm(
        tmp_path_factory.mktemp("llm") / "cosyvoice2_llm", "tiny", qwen2lm_state_dict(), 0
    )
    engine = LLMEngine.from_pretrained(
        model_dir, device="cpu", max_batch_size=1, max_seq_len=256, cuda_graphs=False
    )
    with TestClient(create_llm_app(ServedModel.from_model_dir(engine, model_dir))) as client:
        yield client


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("path", LLM_PATHS)
def test_llm_rejects_hostile_json_and_keeps_serving(llm, path, case):
    body, says = LLM_BODIES[path][case]
    assert_rejected(llm.post(path, content=body, headers={"content-type": "application/json"}), says)
    good = llm.post(path, json=LLM_PATHS[path])
    assert good.status_code == 200 and good.json()["choices"][0]["finish_reason"] == "length", good.text


@pytest.mark.parametrize("value", ['"nan"', '"-inf"', '"1e999"'])
def test_llm_number_fields_must_be_finite(llm, value):
    response = llm.post("/v1/completions", content=with_field(COMPLETION, "temperature", value.encode()))
    assert_rejected(response, "finite number", "temperature")


# --- the real speech API process over Triton --------------------------------------------------------------


@pytest.fixture(scope="module")
def api(triton, tmp_path_factory, prompt_zh) -> Iterator[str]:
    server = triton.load("audio_tokenizer", "vocoder", "tensorrt_llm_offline", "spark_tts_offline")
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--model", ROUTE]
    with api_process(
        *args, "--max-new-tokens=20", log_file=tmp_path_factory.mktemp("api") / "api.log"
    ) as url:
        yield url


def test_the_speech_api_process_rejects_hostile_json_and_keeps_serving(api):
    with httpx.Client(base_url=api, timeout=120) as http:
        for body, says in SPEECH_BODIES.values():
            headers = {"content-type": "application/json"}
            assert_rejected(http.post("/v1/audio/speech", content=body, headers=headers), says)
        for fields, param, says in FORM_FIELDS.values():
            assert_rejected(post_form(http, fields, multipart=True), says, param)
        good = http.post("/v1/audio/speech", json=SPEECH)
        assert good.status_code == 200, good.text
        samples, _ = decode(good.content, "pcm", 16000)
        assert samples.size > 0 and np.isfinite(samples).all()
        assert http.get("/health").status_code == 200
