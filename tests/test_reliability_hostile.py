"""Scenario 4 of the reliability suite: hostile input.

What must hold: over 500 generated malformed requests, tensors over Triton's gRPC and HTTP to the offline BLS of
each model family (Spark-TTS, CosyVoice2, CosyVoice2-DiT) and bodies to the speech API (speech requests and
voice uploads): each is rejected with INVALID_ARGUMENT / HTTP 400 (gRPC, HTTP) or a 4xx (API) whose message
names the field; odd but valid input (stereo, 8 or 48 kHz uploads, an optional input left out) is served or
rejected the same way; zero 5xx; zero stub restarts; a good request after every 50 succeeds. Oversized, truncated
and slowly sent bodies: 413, or an error for that client alone while others are served.
"""

from __future__ import annotations

import random
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cosyvoice2_dit_models import build_cosyvoice2_dit_models
from cosyvoice2_models import build_cosyvoice2_models
from reliability_hostile import api_cases, long_audio_case, tensor_cases, wav_bytes
from reliability_models import (
    SPARK_MODELS,
    SPARK_OFFLINE,
    build_reliability_models,
    knob,
    loaded,
    record,
    reference_fixture,
    spark_arrays,
    speech_api,
)
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tritontts.triton.stubs import list_stubs

TRITON_MODELS = [build_reliability_models, build_cosyvoice2_models, build_cosyvoice2_dit_models]
pytestmark = pytest.mark.reliability
COSY = ("cosyvoice2_audio_tokenizer", "cosyvoice2_speaker_embedding", "cosyvoice2_token2wav")
COSY += (
    "cosyvoice2_tensorrt_llm_offline",
    "cosyvoice2_offline",
    "cosyvoice2_token2wav_dit",
    "cosyvoice2_dit_offline",
)
# (model, reference optional, reference_wav_len optional)
TARGETS = (
    (SPARK_OFFLINE, False, False),
    ("cosyvoice2_offline", True, True),
    ("cosyvoice2_dit_offline", False, True),
)
PER_TARGET_AND_PROTOCOL = int(knob("hostile_per_target", 60))
API_CASES = int(knob("hostile_api", 150))
GOOD_EVERY = 50
SERVER_ERRORS = ("StatusCode.INTERNAL", "StatusCode.UNKNOWN", "StatusCode.UNAVAILABLE")  # gRPC's 5xx
BUDGET = {"max_new_tokens": 5}  # odd but valid requests are served quickly
MAX_UPLOAD = 2_000_000


server = loaded(*SPARK_MODELS, *COSY)


reference = reference_fixture()


@pytest.fixture(scope="module")
def api(server, tmp_path_factory, prompt_zh):
    limits = ["--max-new-tokens", "5", "--max-upload-bytes", str(MAX_UPLOAD), "--max-input-chars", "2000"]
    with speech_api(server.grpc_url, tmp_path_factory, prompt_zh, *limits, spark=SPARK_OFFLINE) as api:
        yield api


def send_tensors(server, protocol: str, model: str, arrays: dict) -> tuple[str, str]:
    """('ok' | status, message) of one request."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    inputs = []
    for name, value in arrays.items():
        tensor = module.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        if protocol == "grpc":
            tensor.set_data_from_numpy(value)
        else:
            tensor.set_data_from_numpy(value, binary_data=True)
        inputs.append(tensor)
    try:
        client.infer(model, inputs, parameters=BUDGET)
        return "ok", ""
    except InferenceServerException as err:
        return str(err.status()), err.message() or str(err)
    finally:
        client.close()


def tensor_rejected_cleanly(protocol: str, status: str, message: str, field: str | None) -> bool:
    clean = "INVALID_ARGUMENT" in status if protocol == "grpc" else status == "400"
    return clean and (field is None or field in message)


def good_request(server, reference) -> str:
    return send_tensors(server, "grpc", SPARK_OFFLINE, spark_arrays(reference))[0]


def test_five_hundred_malformed_requests_are_rejected_naming_the_field(server, reference, api):
    api_url, _ = api
    stubs_before = {(s.instance, s.pid) for s in list_stubs(server.server.pid)}
    rng = random.Random(19)
    work = []
    for model, optional_reference, optional_length in TARGETS:
        base = spark_arrays(reference, "你好。")
        for protocol in ("grpc", "http"):
            for case in tensor_cases(base, rng, PER_TARGET_AND_PROTOCOL, optional_reference, optional_length):
                work.append(("tensor", protocol, model, case))
        work.append(("tensor", "grpc", model, long_audio_case(base)))
    good_wav = wav_bytes(reference, 16000)
    work += [("api", "", "", case) for case in api_cases(rng, API_CASES, good_wav, "zh", "spark")]
    failures, outcomes, good, server_errors = [], {"rejected": 0, "served": 0}, [], 0
    for i, (kind, protocol, model, case) in enumerate(work):
        if kind == "tensor":
            status, message = send_tensors(server, protocol, model, case.arrays)
            clean = status == "ok" if case.field is None else False
            clean = clean or tensor_rejected_cleanly(protocol, status, message, case.field)
        else:
            status, message = send_api(api_url, case)
            clean = (case.field is None and status in (200, 201)) or (
                400 <= status < 500 and (case.field is None or case.field in message)
            )
        outcomes["served" if status in ("ok", 200, 201) else "rejected"] += 1
        server_errors += str(status) in SERVER_ERRORS or (str(status).isdigit() and int(status) >= 500)
        if not clean:
            failures.append(
                f"{kind} {protocol} {model} '{case.name}' (field {case.field}): {status} {message[:300]}"
            )
        if i % GOOD_EVERY == GOOD_EVERY - 1:
            good.append(good_request(server, reference))
    record(
        "hostile_input",
        requests=len(work),
        tensor_requests=sum(w[0] == "tensor" for w in work),
        api_requests=sum(w[0] == "api" for w in work),
        **outcomes,
        not_clean=len(failures),
        server_errors=server_errors,
        good_requests_between=len(good),
        good_ok=good.count("ok"),
    )
    assert len(work) >= 500
    assert failures == [], f"{len(failures)} of {len(work)} not rejected cleanly:\n" + "\n".join(
        failures[:30]
    )
    assert good == ["ok"] * len(good)
    stubs_after = {(s.instance, s.pid) for s in list_stubs(server.server.pid)}
    assert stubs_before <= stubs_after, f"stubs restarted or gone: {stubs_before - stubs_after}"


def send_api(api_url: str, case) -> tuple[int, str]:
    if case.method == "voice":
        reply = httpx.post(
            f"{api_url}/v1/audio/voices", data=case.data, files=case.files or None, timeout=120
        )
    elif case.method == "raw":
        headers = {"content-type": "application/json"}
        reply = httpx.post(f"{api_url}/v1/audio/speech", content=case.body, headers=headers, timeout=120)
    else:
        reply = httpx.post(f"{api_url}/v1/audio/speech", json=case.body, timeout=120)
    if reply.status_code < 300:
        return reply.status_code, ""
    try:
        error = reply.json()["error"]
        return reply.status_code, f"{error.get('param')} {error.get('code')} {error['message']}"
    except (ValueError, KeyError, TypeError):
        return reply.status_code, f"not an OpenAI error body: {reply.text[:200]}"


def test_oversized_truncated_and_slow_bodies_affect_only_their_sender(api):
    api_url, voices = api
    host, port = urlparse(api_url).hostname, urlparse(api_url).port
    big = wav_bytes(np.zeros(MAX_UPLOAD // 2 + 1000, np.float32), 16000)  # past --max-upload-bytes
    reply = httpx.post(
        f"{api_url}/v1/audio/voices",
        data={"name": "big", "transcript": "x"},
        files={"audio_sample": ("a.wav", big)},
    )
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large", reply.text
    slow = socket.create_connection((host, port))
    truncated = socket.create_connection((host, port))
    try:
        head = (
            "POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
        )
        slow.sendall(f"{head}Content-Length: 100000\r\n\r\n--b\r\n".encode())
        truncated.sendall(
            f"{head}Content-Length: 5000\r\n\r\n--b\r\nContent-Disposition: form-data; name=".encode()
        )
        truncated.close()  # the body ends 4950 bytes early
        body = {"model": "spark", "input": "你好。", "voice": "zh", "response_format": "pcm"}

        def speak(_):
            slow.sendall(b"x")  # one byte of the slow body per request served beside it
            return httpx.post(f"{api_url}/v1/audio/speech", json=body, timeout=120).status_code

        with ThreadPoolExecutor(2) as pool:
            assert list(pool.map(speak, range(4))) == [200] * 4
    finally:
        slow.close()
    time.sleep(0.5)
    names = [p.name for p in voices.iterdir()]
    assert [n for n in names if n.startswith(".") or n.startswith("big")] == [], names  # nothing partial kept
    assert {n[:-4] for n in names if n.endswith(".wav")} == {n[:-4] for n in names if n.endswith(".txt")}, (
        names
    )
