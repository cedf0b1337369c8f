"""The API's text normalization default (`--no-text-normalization`) and a server without wetext: the start stops
with a message naming what is missing, rather than answering every request with a 500; started with normalization
off it serves, and a request that asks for normalization gets a 400 naming the field."""

from __future__ import annotations

import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from tritontts.openai_api import Settings, create_app
from tritontts.openai_api.__main__ import get_parser, settings_from_args
from tritontts.openai_api.settings import parse_model_spec
from tritontts.openai_api.speech import SpeechRequest, check_speech_request
from tritontts.text import normalize
from tritontts.text.request import wants_normalization
from tritontts.triton.params import RequestError
from tritontts.triton.server import free_ports

ROUTE = parse_model_spec("spark-offline=spark_tts_offline")
SPEECH = {"model": "spark-offline", "input": "Hello.", "voice": "zh", "response_format": "pcm"}
WITHOUT_WETEXT = "import sys; sys.modules['wetext'] = None; from tritontts.openai_api.__main__ import main; "


@pytest.fixture
def no_wetext(monkeypatch):
    monkeypatch.setitem(
        sys.modules, "wetext", None
    )  # `import wetext` raises ImportError, as when not installed
    normalize.unavailable_reason.cache_clear()
    yield
    normalize.unavailable_reason.cache_clear()


def test_the_flag_sets_the_default_a_request_leaves_out():
    assert settings_from_args(get_parser().parse_args([])).text_normalization is True
    off = settings_from_args(get_parser().parse_args(["--no-text-normalization"]))
    assert off.text_normalization is False
    for settings, field, expected in [
        (Settings(routes=(ROUTE,)), None, True),
        (Settings(routes=(ROUTE,), text_normalization=False), None, False),
        (Settings(routes=(ROUTE,), text_normalization=False), True, True),
        (Settings(routes=(ROUTE,)), False, False),
    ]:
        extra = {} if field is None else {"text_normalization": field}
        request = SpeechRequest.model_validate(SPEECH | extra)
        check_speech_request(request, settings)
        assert request.text_normalization is expected


def test_without_wetext_the_start_stops_with_what_is_missing():
    (port,) = free_ports(1)
    args = ["--port", str(port), "--triton-url", "127.0.0.1:1", "--model", "spark-offline=spark_tts_offline"]
    code = WITHOUT_WETEXT + f"sys.exit(main({args!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "text normalization needs wetext and inflect" in done.stderr
    assert "--no-text-normalization" in done.stderr and "Traceback" not in done.stderr


def test_without_wetext_and_normalization_off_a_request_for_it_is_a_400(no_wetext):
    client = TestClient(
        create_app(Settings(routes=(ROUTE,), triton_url="127.0.0.1:1", text_normalization=False))
    )
    response = client.post("/v1/audio/speech", json=SPEECH | {"text_normalization": True})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "text_normalization"
    assert "cannot normalize text" in error["message"] and "wetext" in error["message"]
    assert "send text_normalization false" in error["message"]


def test_without_wetext_a_bls_request_for_normalization_names_the_parameter(no_wetext):
    assert wants_normalization({}, False) is False
    assert wants_normalization({"text_normalization": False}, True) is False
    with pytest.raises(RequestError) as err:
        wants_normalization({"text_normalization": True}, False)
    assert err.value.field == "text_normalization" and "wetext" in str(err.value)
    with pytest.raises(normalize.NormalizationUnavailable, match="needs wetext and inflect"):
        normalize.check_available()
