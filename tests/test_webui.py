"""The page for trying voices (/ui/) in a real headless Chromium (Debian's `chromium` + `chromium-driver`, driven by
Selenium), in front of the real tritonserver with tiny synthetic Spark-TTS, behind an API key.

Without a browser the browser tests skip, saying why; TRITONTTS_REQUIRE_BROWSER=1 (.ci/run) makes that a failure.
TRITONTTS_WEBUI_SCREENSHOTS=DIR writes the page's screenshots there (docs/images: the ones docs/webui.md shows).
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, TEXT_INBOX, build_cosyvoice2_models
from cosyvoice3_models import build_cosyvoice3_models
from fastapi.testclient import TestClient
from openai_api_process import api_process, decode, zh_voices
from spark_models import SPARK_SERVING, build_spark_models

from tritontts.openai_api.app import create_app
from tritontts.openai_api.settings import Settings, parse_model_spec

TRITON_MODELS = [
    build_spark_models,
    build_cosyvoice2_models,
    build_cosyvoice2_dit_models,
    build_cosyvoice3_models,
]
KEY = "webui-test-key-5d1f"
RATE = 16000
TOKENS = 60  # --max-new-tokens: two streamed chunks (spark_models' first chunk is 50 tokens)
MODELS = [
    "spark-tts=spark_tts,spark_tts_offline",
    "spark-offline=spark_tts_offline",
    "cosyvoice2=cosyvoice2,cosyvoice2_offline",
    "cosyvoice2-dit=cosyvoice2_dit,cosyvoice2_dit_offline",
    "cosyvoice3=cosyvoice3,cosyvoice3_offline",
]
MODEL_NAMES = [spec.split("=")[0] for spec in MODELS]
COSYVOICE2_LEAVES = (
    "audio_tokenizer",
    "speaker_embedding",
    "token2wav",
    "tensorrt_llm",
    "tensorrt_llm_offline",
)
COSYVOICE3_LEAVES = COSYVOICE2_LEAVES + ("vocoder",)
PAGE_FILES = ["", "app.js", "live-text.js", "style.css"]
WAIT_S = 120.0
LIVE_TEXT_PATH = "/v1/audio/speech/stream"
BISTREAM_TEXT = "身临其境，换新体验。塑料袋是个好东西，我们每天都在用。"
"""typed one character at a time: the tiny LLM's first audio needs two segments of 5 text tokens"""
BISTREAM_INSTRUCTIONS = "用开心的语气说"
"""instruct2: no prompt speech for the text to cover first (test_speech_ws_bistream)"""


# --- without a browser or Triton ----------------------------------------------------------------------------


def test_the_page_is_served_unless_turned_off():
    routes = tuple(parse_model_spec(spec) for spec in MODELS)
    with TestClient(create_app(Settings(triton_url="127.0.0.1:9", routes=routes))) as client:
        assert client.get("/", follow_redirects=False).headers["location"] == "ui/"
        assert client.get("/ui", follow_redirects=False).headers["location"] == "ui/"
        page = client.get("/", follow_redirects=True)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere
        for path in ("/ui/../app.py", "/ui/ui.py", "/ui/static/app.js", "/ui/%2e%2e/app.py"):
            response = client.get(path)
            assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
        models = client.get("/v1/models").json()["data"]  # Triton unreachable: listed, not ready
        assert [(m["id"], m["ready"], m["modes"], m["streaming"], m["bistream"]) for m in models] == [
            (name, False, None, None, None) for name in MODEL_NAMES
        ]
    with TestClient(create_app(Settings(triton_url="127.0.0.1:9", routes=routes, ui=False))) as client:
        for path in ("/", "/ui", "/ui/", "/ui/app.js"):
            assert client.get(path, follow_redirects=False).status_code == 404


def test_the_flag_turns_the_page_off():
    from tritontts.openai_api.__main__ import get_parser, settings_from_args

    assert settings_from_args(get_parser().parse_args([])).ui is True
    assert settings_from_args(get_parser().parse_args(["--no-ui"])).ui is False


# --- the real server ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")  # session: set up before (and so skips without) the session's tritonserver
def browser_paths() -> tuple[str, str]:
    """Chromium and its driver, or a skip (a failure under TRITONTTS_REQUIRE_BROWSER=1) saying what is missing."""
    chromium = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    missing = [n for n, p in (("chromium", chromium), ("chromedriver (chromium-driver)", driver)) if not p]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (requirements-dev.txt)")
    if missing:
        reason = f"no browser for the page's tests: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
        if os.environ.get("TRITONTTS_REQUIRE_BROWSER") == "1":
            pytest.fail(reason + "; TRITONTTS_REQUIRE_BROWSER=1 requires it")
        pytest.skip(reason)
    return chromium, driver


@pytest.fixture(scope="module")
def api(browser_paths, triton, tmp_path_factory, prompt_zh) -> Iterator[str]:
    server = triton.load(*SPARK_SERVING)
    server.load(*(PREFIX + leaf for leaf in COSYVOICE2_LEAVES), "cosyvoice2", "cosyvoice2_offline")
    server.load(TOKEN2WAV_DIT, "cosyvoice2_dit", "cosyvoice2_dit_offline")
    server.load(*(f"cosyvoice3_{leaf}" for leaf in COSYVOICE3_LEAVES), "cosyvoice3", "cosyvoice3_offline")
    server.load(TEXT_INBOX)  # bistream sessions' text (the CosyVoice BLS configs name it)
    voices = zh_voices(tmp_path_factory.mktemp("voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += [f"--max-new-tokens={TOKENS}", "--max-input-chars=300"]
    for spec in MODELS:
        args += ["--model", spec]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url


@pytest.fixture(scope="module")
def http(api) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api, headers={"Authorization": f"Bearer {KEY}"}, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def browser(browser_paths, prompt_zh):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = browser_paths
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager downloads nothing
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1100,1000",
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={prompt_zh}",
        "--autoplay-policy=no-user-gesture-required",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.set_script_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


def wait(condition: Callable[[], object], what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def page(browser, api):
    """The page with the key entered (test_the_page_asks_for_the_key checks the way there)."""
    browser.get(f"{api}/")
    wait(lambda: browser.find_element("id", "key-panel").is_displayed(), "the key prompt")
    enter_key(browser, KEY)
    wait(lambda: browser.execute_script("return document.body.dataset.ready"), "the models")
    browser.execute_script("window.confirm = () => true")
    return browser


def enter_key(browser, key: str) -> None:
    field = browser.find_element("id", "key-input")
    field.clear()
    field.send_keys(key)
    browser.find_element("id", "key-submit").click()


def by_id(browser, name: str):
    return browser.find_element("id", name)


def select(browser, name: str, value: str) -> None:
    from selenium.webdriver.support.select import Select

    Select(by_id(browser, name)).select_by_value(value)


def options(browser, name: str) -> list[str]:
    return browser.execute_script(
        "return [...document.getElementById(arguments[0]).options].map(o => o.value)", name
    )


def speak(browser, text: str) -> str:
    """Speak `text` with the page's current choices; the run's end state (done or error)."""
    field = by_id(browser, "text")
    field.clear()
    field.send_keys(text)
    browser.execute_script('document.getElementById("result").dataset.state = ""')
    by_id(browser, "speak").click()
    return wait(
        lambda: (
            (state := by_id(browser, "result").get_attribute("data-state")) in ("done", "error") and state
        ),
        "the run to end",
    )


def output_seconds(browser) -> float:
    """The duration of the page's audio element, once it has loaded, after it played (it must play)."""
    script = """
    const [done] = [arguments[arguments.length - 1]];
    const audio = document.getElementById("output");
    const ready = () => audio.play().then(() => { audio.pause(); done(audio.duration); }, (e) => done(String(e)));
    if (audio.readyState >= 1) ready(); else audio.addEventListener("loadedmetadata", ready, { once: true });
    """
    duration = browser.execute_async_script(script)
    assert isinstance(duration, float), duration
    return duration


def api_seconds(http: httpx.Client, **fields) -> float:
    body = {"model": "spark-tts", "voice": "zh", "input": "Hello there.", "response_format": "wav", **fields}
    response = http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    samples, rate = decode(response.content, "wav", RATE)
    return samples.size / rate


def api_message(response: httpx.Response) -> str:
    return response.json()["error"]["message"]


def websocket_opens(base: str, path: str) -> bool:
    """Whether the API accepts a WebSocket at `path` (a bare handshake, closed at once)."""
    url = urlsplit(base)
    handshake = (
        f"GET {path} HTTP/1.1\r\nHost: {url.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port), timeout=30) as connection:
        connection.sendall(handshake.encode())
        return connection.recv(12).startswith(b"HTTP/1.1 101")


def screenshot(browser, name: str) -> None:
    directory = os.environ.get("TRITONTTS_WEBUI_SCREENSHOTS")
    if not directory:
        return
    from PIL import Image

    image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    image = image.quantize(colors=64)
    Path(directory).mkdir(parents=True, exist_ok=True)
    image.save(Path(directory) / f"webui_{name}.png", optimize=True)


def test_the_page_asks_for_the_key_which_its_files_never_hold(api, browser):
    for name in PAGE_FILES:
        response = httpx.get(f"{api}/ui/{name}", timeout=30)
        assert response.status_code == 200 and KEY not in response.text
    assert httpx.get(f"{api}/v1/models", timeout=30).status_code == 401
    browser.get(f"{api}/")
    assert browser.current_url == f"{api}/ui/"
    wait(lambda: by_id(browser, "key-panel").is_displayed(), "the key prompt")
    assert not by_id(browser, "main-panel").is_displayed()
    enter_key(browser, "wrong")
    wait(lambda: by_id(browser, "key-error").is_displayed(), "the key's refusal")
    refusal = httpx.get(f"{api}/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=30)
    assert by_id(browser, "key-error").text == api_message(refusal)
    enter_key(browser, KEY)
    wait(lambda: browser.execute_script("return document.body.dataset.ready"), "the models")
    assert browser.execute_script("return sessionStorage.length") == 0  # not kept unless asked to
    assert KEY not in browser.page_source


def test_the_models_and_their_modes_are_listed(page, http, api):
    cards = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert cards["spark-tts"] | {"object": None} == {
        "id": "spark-tts",
        "object": None,
        "owned_by": "tritontts",
        "sample_rate": RATE,
        "ready": True,
        "modes": ["clone", "create"],
        "streaming": True,
        "bistream": False,
    }
    assert cards["spark-offline"]["streaming"] is False
    assert {name: card["bistream"] for name, card in cards.items()} == {
        "spark-tts": False,
        "spark-offline": False,
        "cosyvoice2": True,
        "cosyvoice2-dit": True,
        "cosyvoice3": True,
    }
    assert cards["cosyvoice2"]["modes"] == ["clone", "cross_lingual", "instruct2"]
    assert cards["cosyvoice2"]["sample_rate"] == 24000
    assert options(page, "model") == MODEL_NAMES
    modes = page.find_elements("css selector", 'input[name="mode"]')
    assert [m.get_attribute("value") for m in modes] == ["clone", "create"]
    assert options(page, "voice") == ["zh"]
    # the hook of the WebSocket text-in mode: shown exactly when the app has the endpoint
    endpoint = websocket_opens(api, LIVE_TEXT_PATH)
    wait(lambda: page.execute_script("return window.liveTextChecked"), "the endpoint's probe", 10)
    assert by_id(page, "live-text").is_displayed() == endpoint
    page.find_element("css selector", 'input[name="mode"][value="create"]').click()
    assert by_id(page, "design-box").is_displayed() and not by_id(page, "instructions-box").is_displayed()
    assert options(page, "pitch") == ["very_low", "low", "moderate", "high", "very_high"]
    page.find_element("css selector", 'input[name="mode"][value="clone"]').click()
    assert not by_id(page, "design-box").is_displayed()


@pytest.mark.parametrize("stream_format", ["audio", "sse"])
def test_streamed_speech_plays_as_it_arrives_and_lasts_as_the_apis(page, http, stream_format):
    select(page, "model", "spark-tts")
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    select(page, "stream-format", stream_format)
    assert speak(page, "Hello there.") == "done", by_id(page, "error").text
    # played piece by piece as it came: SSE's events one by one (raw reads may join pieces that come together)
    assert int(by_id(page, "chunks").text) >= (2 if stream_format == "sse" else 1)
    assert float(by_id(page, "ttfa").get_attribute("data-ms")) > 0
    assert float(by_id(page, "rtf").text) > 0
    expected = api_seconds(http)
    assert output_seconds(page) == pytest.approx(expected, abs=1e-3)
    link = by_id(page, "download")
    assert link.is_displayed() and link.get_attribute("download") == "speech.wav"
    assert link.get_attribute("href").startswith("blob:")
    if stream_format == "audio":
        screenshot(page, "speech")


def test_a_whole_file_from_a_model_without_streaming(page, http):
    select(page, "model", "spark-offline")
    assert not by_id(page, "stream").is_enabled()
    select(page, "voice", "zh")
    assert speak(page, "Hello there.") == "done", by_id(page, "error").text
    assert output_seconds(page) == pytest.approx(api_seconds(http, model="spark-offline"), abs=1e-3)
    select(page, "model", "spark-tts")
    assert by_id(page, "stream").is_enabled() and by_id(page, "stream").is_selected()


def test_a_reference_file_then_a_recording_saved_used_and_deleted(page, http, prompt_zh):
    page.find_element("css selector", '.tab[data-source="upload"]').click()
    by_id(page, "ref-file").send_keys(str(prompt_zh))
    wait(lambda: by_id(page, "reference-box").get_attribute("data-ready"), "the reference")
    assert "9.95 s" in by_id(page, "ref-info").text
    by_id(page, "ref-text").send_keys(PROMPT_ZH_TEXT)
    assert speak(page, "Hello there.") == "done", by_id(page, "error").text
    screenshot(page, "reference")

    page.find_element("css selector", '.tab[data-source="record"]').click()
    page.execute_script('document.getElementById("reference-box").dataset.ready = ""')
    by_id(page, "record-start").click()
    wait(lambda: by_id(page, "record-state").text == "recording…", "the recording")
    time.sleep(1.5)
    by_id(page, "record-stop").click()
    wait(lambda: by_id(page, "reference-box").get_attribute("data-ready"), "the recorded reference")
    assert by_id(page, "ref-info").text.startswith("recording, ")
    by_id(page, "voice-name").send_keys("mic")
    by_id(page, "voice-save").click()
    wait(lambda: "mic" in options(page, "voice"), "the saved voice in the list")
    saved = {v["name"]: v for v in http.get("/v1/audio/voices").json()["data"]}
    assert 1.0 < saved["mic"]["duration"] < 3.0 and saved["mic"]["transcript"] == PROMPT_ZH_TEXT
    assert by_id(page, "voice").get_attribute("value") == "mic"  # the page switched to it
    assert speak(page, "Hello there.") == "done", by_id(page, "error").text
    assert output_seconds(page) == pytest.approx(api_seconds(http, voice="mic"), abs=1e-3)
    by_id(page, "voice-delete").click()
    wait(lambda: "mic" not in options(page, "voice"), "the voice gone from the list")
    assert "mic" not in {v["name"] for v in http.get("/v1/audio/voices").json()["data"]}


def test_api_errors_are_shown_as_the_api_words_them(page, http, prompt_zh):
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    assert speak(page, "   ") == "error"
    assert page.execute_script('return document.getElementById("output").readyState') == 0  # emptied
    refusal = http.post("/v1/audio/speech", json={"model": "spark-tts", "voice": "zh", "input": "   "})
    assert refusal.status_code == 400
    assert by_id(page, "error").text == f"{api_message(refusal)} (input)"
    assert speak(page, "x" * 301) == "error"  # over --max-input-chars
    refusal = http.post("/v1/audio/speech", json={"model": "spark-tts", "voice": "zh", "input": "x" * 301})
    assert by_id(page, "error").text == f"{api_message(refusal)} (input)"
    screenshot(page, "error")

    page.find_element("css selector", '.tab[data-source="upload"]').click()
    wait(lambda: by_id(page, "reference-box").is_displayed(), "the reference of the earlier test")
    name = by_id(page, "voice-name")
    name.clear()
    name.send_keys("zh")  # taken
    by_id(page, "voice-save").click()
    wait(lambda: by_id(page, "error").is_displayed(), "the 409")
    files = {"audio_sample": ("zh.wav", prompt_zh.read_bytes(), "audio/wav")}
    refusal = http.post("/v1/audio/voices", data={"name": "zh", "transcript": "x"}, files=files)
    assert refusal.status_code == 409
    assert by_id(page, "error").text == f"{api_message(refusal)} (name)"
    assert speak(page, "Hello there.") == "done"  # the page still works
    assert not by_id(page, "error").is_displayed()


def test_cosyvoice2_follows_instructions_and_speaks_cross_lingually(page, http):
    select(page, "model", "cosyvoice2")
    modes = page.find_elements("css selector", 'input[name="mode"]')
    assert [m.get_attribute("value") for m in modes] == ["clone", "cross_lingual", "instruct2"]
    page.find_element("css selector", 'input[name="mode"][value="instruct2"]').click()
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    by_id(page, "instructions").send_keys("用四川话说这句话")
    select(page, "stream-format", "audio")
    assert by_id(page, "stream").is_selected()
    assert speak(page, "收到好友的礼物。") == "done", by_id(page, "error").text
    assert int(by_id(page, "chunks").text) >= 1 and by_id(page, "status").text.endswith("streamed.")
    fields = {"model": "cosyvoice2", "instructions": "用四川话说这句话", "input": "收到好友的礼物。"}
    assert output_seconds(page) == pytest.approx(api_seconds(http, **fields), abs=1e-3)
    screenshot(page, "instruct")

    page.find_element("css selector", 'input[name="mode"][value="cross_lingual"]').click()
    assert not page.find_element("css selector", '.tab[data-source="saved"]').is_enabled()
    assert not by_id(page, "ref-text").is_displayed()  # cross-lingual: a reference without transcript
    assert by_id(page, "reference-box").is_displayed()  # the reference of the earlier tests
    assert speak(page, "Hello there.") == "done", by_id(page, "error").text
    assert output_seconds(page) > 0
    page.find_element("css selector", 'input[name="mode"][value="clone"]').click()
    select(page, "model", "spark-tts")


def forget_the_last_result(page) -> None:
    """Clears what an earlier utterance left on the page (its state, chunk count and live-text marks), so that a
    wait for the next one's audio cannot pass on the last one's."""
    page.execute_script(
        'document.getElementById("result").dataset.state = "";'
        'document.getElementById("chunks").textContent = "–";'
        'delete document.getElementById("live-text").dataset.bistream;'
    )


def test_text_typed_in_is_spoken_sentence_by_sentence(page, http, api):
    if not websocket_opens(api, LIVE_TEXT_PATH):
        pytest.skip(f"this API has no {LIVE_TEXT_PATH}: the page hides the mode")
    select(page, "model", "spark-tts")
    page.find_element("css selector", 'input[name="mode"][value="clone"]').click()
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    forget_the_last_result(page)
    live = by_id(page, "live-input")
    live.send_keys("Hello there. How are you? ")
    wait(lambda: by_id(page, "chunks").text not in ("–", "0"), "the first sentences' audio before the end")
    live.send_keys("Fine")
    by_id(page, "live-done").click()
    wait(lambda: by_id(page, "result").get_attribute("data-state") == "done", "the utterance's end")
    section = by_id(page, "live-text")
    assert section.get_attribute("data-sentences") == "3"
    seconds = float(section.get_attribute("data-seconds"))
    assert output_seconds(page) == pytest.approx(seconds, abs=1e-3)
    assert seconds == pytest.approx(3 * api_seconds(http), abs=0.05)  # each sentence as long as a request's
    screenshot(page, "live")


def test_text_typed_in_joins_one_bistream_utterance_where_the_model_takes_it(page, api):
    if not websocket_opens(api, LIVE_TEXT_PATH):
        pytest.skip(f"this API has no {LIVE_TEXT_PATH}: the page hides the mode")
    select(page, "model", "spark-tts")
    assert not by_id(page, "live-bistream").is_displayed()  # Spark-TTS takes no bistream
    select(page, "model", "cosyvoice2")
    switch = by_id(page, "live-bistream")
    assert switch.is_displayed() and not switch.is_selected()
    switch.click()
    page.find_element("css selector", 'input[name="mode"][value="instruct2"]').click()
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    by_id(page, "instructions").clear()
    by_id(page, "instructions").send_keys(BISTREAM_INSTRUCTIONS)
    forget_the_last_result(page)
    live = by_id(page, "live-input")
    live.send_keys(BISTREAM_TEXT)
    wait(lambda: by_id(page, "chunks").text not in ("–", "0"), "audio before the end of the text")
    section = by_id(page, "live-text")
    assert section.get_attribute("data-bistream") == "true"  # the audio.start of a bistream utterance
    assert by_id(page, "result").get_attribute("data-state") == "running"
    live.send_keys("今天天气很好，出去走走吧！")
    by_id(page, "live-done").click()
    wait(lambda: by_id(page, "result").get_attribute("data-state") == "done", "the utterance's end")
    assert section.get_attribute("data-sentences") == "1"  # one utterance, not one request per sentence
    seconds = float(section.get_attribute("data-seconds"))
    assert seconds > 0 and output_seconds(page) == pytest.approx(seconds, abs=1e-3)
    switch.click()
    page.find_element("css selector", 'input[name="mode"][value="clone"]').click()

    select(page, "model", "spark-tts")  # the server's refusal, shown as the page shows the API's errors
    page.execute_script('document.getElementById("live-bistream").closest("label").hidden = false')
    switch.click()
    live.send_keys("Hello there. ")
    wait(lambda: by_id(page, "error").is_displayed(), "the bistream_unavailable error")
    assert page.execute_script("return document.body.dataset.error") == "bistream_unavailable"
    error = by_id(page, "error").text
    assert "model 'spark-tts' takes no bistream sessions" in error and error.endswith(" (bistream)")
    assert by_id(page, "result").get_attribute("data-state") == "error"
    switch.click()
    page.execute_script(
        'const box = document.getElementById("live-input"); box.value = "";'
        'box.dispatchEvent(new Event("input"))'
    )
    select(page, "model", "cosyvoice2")
    assert switch.is_displayed() and not switch.is_selected()
    select(page, "model", "spark-tts")
    assert not switch.is_displayed()


@pytest.mark.parametrize("model", ["cosyvoice2-dit", "cosyvoice3"])
def test_the_other_families_stream_a_saved_voice(page, http, model):
    select(page, "model", model)
    modes = page.find_elements("css selector", 'input[name="mode"]')
    assert [m.get_attribute("value") for m in modes] == ["clone", "cross_lingual", "instruct2"]
    page.find_element("css selector", 'input[name="mode"][value="clone"]').click()
    page.find_element("css selector", '.tab[data-source="saved"]').click()
    select(page, "voice", "zh")
    select(page, "stream-format", "audio")
    assert speak(page, "收到好友的礼物。") == "done", by_id(page, "error").text
    fields = {"model": model, "input": "收到好友的礼物。"}
    assert output_seconds(page) == pytest.approx(api_seconds(http, **fields), abs=1e-3)
    select(page, "model", "spark-tts")
