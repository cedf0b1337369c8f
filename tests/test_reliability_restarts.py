"""Scenario 6 of the reliability suite: restarts and data.

What must hold: the speech API killed (SIGKILL) and started again while requests and voice uploads run: the
requests in flight fail with a connection error (none hangs), clients reconnect and are served, every voice whose
upload was answered 201 is intact and speaks, no partial voice is listed, and two concurrent uploads of one name
give one 201 and one 409. tritonserver stopped and started again under load: the requests in flight fail
cleanly, the API's /health answers 503 while Triton is away and 200 once it is back, and clients are served again.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import TRITON_MODELS_DIR
from http_service import health_probe, start_python
from reliability_hostile import wav_bytes
from reliability_models import (
    REFERENCE_TEXT,
    SPARK_MODELS,
    SPARK_OFFLINE,
    api_args,
    build_reliability_models,
    loaded,
    record,
    reference_clip,
    voices_folder,
)
from tritonclient.utils import InferenceServerException, np_to_triton_dtype
from waiting import scaled, wait_started, wait_until

from tritontts.triton.server import ServerConfig, TritonServer, free_ports

TRITON_MODELS = [build_reliability_models]
pytestmark = pytest.mark.reliability
HANG_S = 120


server = loaded(*SPARK_MODELS)


def start_api(args: list[str], port: int, log: Path, wait_for: int = 200) -> subprocess.Popen:
    """The API on `port` once /health answers `wait_for` (its output appended to `log`: it restarts into it)."""
    command = [
        sys.executable,
        "-m",
        "tritontts.openai_api",
        "--port",
        str(port),
        *args,
        "--log-level",
        "warning",
    ]
    process = start_python(command, log, mode="ab")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_started(
            process, health_probe(url, wait_for), f"the API answering {wait_for} on {url}/health", log
        )
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def test_the_api_killed_under_load_keeps_every_saved_voice(server, tmp_path, prompt_zh):
    voices = voices_folder(tmp_path / "voices", prompt_zh)
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    args = api_args(server.grpc_url, voices, spark=SPARK_OFFLINE) + ["--max-new-tokens", "5"]
    api = start_api(args, port, tmp_path / "api.log")
    audio = wav_bytes(reference_clip(prompt_zh), 16000)
    saved, outcomes, stop = [], {"ok": 0, "connection_error": 0, "hang": 0, "other": []}, threading.Event()
    lock = threading.Lock()

    def count(kind: str, detail: str = "") -> None:
        with lock:
            if kind == "other":
                outcomes["other"].append(detail)
            else:
                outcomes[kind] += 1

    def call(method: str, path: str, **kwargs) -> httpx.Response | None:
        try:
            return httpx.request(method, f"{url}{path}", timeout=HANG_S, **kwargs)
        except httpx.TimeoutException:
            count("hang")
        except httpx.TransportError:
            count("connection_error")
            time.sleep(0.2)
        return None

    def speaker():
        body = {"model": "spark", "input": "你好。", "voice": "zh", "response_format": "pcm"}
        while not stop.is_set():
            reply = call("POST", "/v1/audio/speech", json=body)
            if reply is not None:
                count("ok") if reply.status_code == 200 else count("other", reply.text[:200])

    def uploader():
        for i in range(10**6):
            if stop.is_set():
                return
            name = f"v{i}"
            files = {"audio_sample": ("a.wav", audio, "audio/wav")}
            data = {"name": name, "transcript": REFERENCE_TEXT}  # the clip's words: the synthetic LLM speaks
            reply = call("POST", "/v1/audio/voices", data=data, files=files)
            if reply is not None and reply.status_code == 201:
                saved.append(name)
            elif reply is not None and reply.status_code != 409:  # 409: the killed API had written it
                count("other", reply.text[:200])

    threads = [threading.Thread(target=speaker) for _ in range(2)] + [threading.Thread(target=uploader)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        api.send_signal(signal.SIGKILL)
        api.wait()
        killed = time.monotonic()
        api = start_api(args, port, tmp_path / "api.log")
        back = time.monotonic() - killed
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=HANG_S * 2)
    with ThreadPoolExecutor(2) as pool:
        files = {"audio_sample": ("a.wav", audio, "audio/wav")}
        codes = sorted(
            pool.map(
                lambda _: (
                    httpx.post(
                        f"{url}/v1/audio/voices", data={"name": "dup", "transcript": "x"}, files=files
                    ).status_code
                ),
                range(2),
            )
        )
    listed = {v["id"]: v for v in httpx.get(f"{url}/v1/audio/voices").json()["data"]}
    spoken = {}
    for name in saved:
        body = {"model": "spark", "input": "你好。", "voice": name, "response_format": "pcm"}
        spoken[name] = httpx.post(f"{url}/v1/audio/speech", json=body, timeout=HANG_S).status_code
    api.terminate()
    api.wait(timeout=15)
    record("api_restart", requests_ok=outcomes["ok"], connection_errors=outcomes["connection_error"],
           hangs=outcomes["hang"], voices_saved=len(saved), api_back_after_s=round(back, 1))  # fmt: skip
    assert outcomes["hang"] == 0 and outcomes["other"] == [], outcomes
    assert codes == [201, 409]
    assert saved and all(name in listed and listed[name]["duration"] > 2.9 for name in saved), (saved, listed)
    assert set(spoken.values()) == {200}, spoken
    listed_files = {p.stem for p in voices.glob("*.wav") if not p.name.startswith(".")}
    assert listed_files <= set(listed) | {"zh"}, listed_files - set(listed)


def echo_request(url: str) -> str:
    client = grpcclient.InferenceServerClient(url)
    x = np.ones(4, np.float32)
    inputs = [
        grpcclient.InferInput("X", [4], "FP32"),
        grpcclient.InferInput("TEXT", [1], np_to_triton_dtype(np.object_)),
    ]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([b"t"], dtype=object))
    try:
        client.infer("infra_echo", inputs, client_timeout=HANG_S)
        return "ok"
    except InferenceServerException as err:
        return "hang" if "Deadline" in str(err) else "error"
    finally:
        client.close()


def test_tritonserver_restarted_under_load_fails_in_flight_requests_cleanly(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "infra_echo").symlink_to(TRITON_MODELS_DIR / "infra_echo", target_is_directory=True)
    ports = free_ports(4)
    config = ServerConfig(repo, *ports[:3], log_file=tmp_path / "triton.log", exit_timeout_s=5)
    triton = TritonServer(config)
    triton.start()
    triton.wait_ready(scaled(120))
    grpc_url = triton.grpc_url
    args = api_args(grpc_url, tmp_path / "voices", echo="infra_echo")
    api = start_api(args, ports[3], tmp_path / "api.log")
    health = f"http://127.0.0.1:{ports[3]}/health"
    outcomes: list[str] = []
    stop = threading.Event()

    def client():
        while not stop.is_set():
            outcomes.append(echo_request(grpc_url))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2)
        before = len(outcomes)
        triton.stop(grace_s=15)
        down = httpx.get(health, timeout=30).status_code
        triton.start()
        triton.wait_ready(scaled(120))
        up = wait_until(
            lambda: httpx.get(health, timeout=scaled(30)).status_code,
            lambda code: code == 200,
            "the API's /health to answer 200 again once Triton is back",
            timeout=60,
            interval=0.5,
        )
        # gRPC clients of one process share a connection to an address, and its reconnect backoff (1 s, then
        # longer) outlasts a restart: requests fail fast until it has reconnected, then every one is served
        wait_until(
            lambda: echo_request(grpc_url),
            lambda outcome: outcome == "ok",
            "a request served again",
            timeout=150,
        )
        time.sleep(0.5)  # requests started before that reconnect have ended
        after_restart = len(outcomes)
        time.sleep(2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=HANG_S * 2)
        api.terminate()
        api.wait(timeout=15)
        triton.stop(grace_s=15)
    record(
        "triton_restart", requests=len(outcomes), failed=outcomes.count("error"), hung=outcomes.count("hang")
    )
    assert "hang" not in outcomes
    assert outcomes[:before].count("ok") == before  # served before the restart
    assert (down, up) == (503, 200)
    assert outcomes[after_restart:] and set(outcomes[after_restart:]) == {"ok"}, outcomes[after_restart:]
