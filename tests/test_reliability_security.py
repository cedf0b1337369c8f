"""Scenario 7 of the reliability suite: security checks.

What must hold: the API key is compared in constant time (hmac.compare_digest) and never written to the log,
whatever the log level; every server we start (speech API, LLM OpenAI server, tritonserver, the disaggregated
launcher) listens on loopback unless told otherwise, checked on the live sockets; request bodies and uploads are
size-limited (413, Content-Length or not); no voice name from a request reaches a file outside the voices folder.
"""

from __future__ import annotations

import inspect
import ipaddress
import os
import shutil
from pathlib import Path

import httpx
import pytest
from reliability_hostile import wav_bytes
from reliability_models import (
    SPARK_MODELS,
    SPARK_OFFLINE,
    api_args,
    build_reliability_models,
    loaded,
    voices_folder,
)

from tritontts.audio import load_wav

TRITON_MODELS = [build_reliability_models]
pytestmark = pytest.mark.reliability
KEY = "s3cret-key-of-the-reliability-suite"
MAX_REQUEST = 4000
MAX_UPLOAD = 300_000


server = loaded(*SPARK_MODELS)


@pytest.fixture(scope="module")
def setup(server, tmp_path_factory, prompt_zh):
    root = tmp_path_factory.mktemp("security")
    voices = voices_folder(root / "voices", prompt_zh)
    shutil.copy(prompt_zh, root / "secret.wav")  # a voice-shaped pair beside the folder, never to be reached
    (root / "secret.txt").write_text("secret\n", encoding="utf-8")
    log = root / "api.log"
    args = api_args(server.grpc_url, voices, spark=SPARK_OFFLINE)
    args += ["--api-key", KEY, "--max-new-tokens", "5", "--max-request-bytes", str(MAX_REQUEST)]
    args += ["--max-upload-bytes", str(MAX_UPLOAD)]
    from http_service import http_service

    with http_service("tritontts.openai_api", [*args, "--log-level", "debug"], log) as url:
        yield url, root, voices, log


def auth(key: str = KEY) -> dict:
    return {"Authorization": f"Bearer {key}"}


def socket_addresses(pid: int) -> set[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """(address, port) of every TCP socket `pid` listens on (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            host, port = fields[1].split(":")
            found.add((_address(bytes.fromhex(host)), int(port, 16)))
    return found


def _address(raw: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address of /proc/net/tcp{,6}: 32-bit words in host (little-endian) byte order; an IPv4-mapped IPv6
    address (::ffff:a.b.c.d, a dual-stack socket bound to an IPv4 address) is read as its IPv4 address."""
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ipaddress.IPv4Address(words)
    address = ipaddress.IPv6Address(words)
    return address.ipv4_mapped or address


def test_proc_net_addresses_are_read_as_loopback_or_not():
    """The parsing the next test relies on, on the rows /proc/net/tcp6 shows for ::1, ::ffff:127.0.0.1, ::."""
    assert _address(bytes.fromhex("0100007F")) == ipaddress.IPv4Address("127.0.0.1")
    assert _address(bytes.fromhex("0000000000000000FFFF00000100007F")) == ipaddress.IPv4Address("127.0.0.1")
    assert _address(bytes.fromhex("00000000000000000000000001000000")) == ipaddress.IPv6Address("::1")
    assert not _address(bytes.fromhex("00000000000000000000000000000000")).is_loopback
    assert not _address(bytes.fromhex("00000000")).is_loopback


def test_the_api_key_is_compared_in_constant_time_and_never_logged(setup):
    from tritontts.openai_api import app

    assert "hmac.compare_digest" in inspect.getsource(app.create_app)
    url, _, _, log = setup
    body = {"model": "spark", "input": "你好。", "voice": "zh", "response_format": "pcm"}
    assert httpx.post(f"{url}/v1/audio/speech", json=body, timeout=120).status_code == 401
    assert (
        httpx.post(f"{url}/v1/audio/speech", json=body, headers=auth(KEY[:-1]), timeout=120).status_code
        == 401
    )
    assert (
        httpx.post(f"{url}/v1/audio/speech", json=body, headers=auth(KEY + "x"), timeout=120).status_code
        == 401
    )
    assert httpx.post(f"{url}/v1/audio/speech", json=body, headers=auth(), timeout=120).status_code == 200
    assert httpx.get(f"{url}/v1/models", headers=auth("wrong"), timeout=30).status_code == 401
    text = log.read_text()
    assert "/v1/audio/speech" in text  # the debug log saw the requests
    assert KEY not in text and KEY[:12] not in text


def test_every_server_listens_on_loopback_by_default(setup, server):
    from scripts_args import defaults

    assert defaults() == {
        "speech API --host": "127.0.0.1",
        "LLM OpenAI server --host": "127.0.0.1",
        "scripts/triton_server.py --address": "127.0.0.1",
        "disaggregated start --address": "127.0.0.1",
        "TritonServer address": "127.0.0.1",
    }
    listening = socket_addresses(server.server.pid)
    assert listening and all(address.is_loopback for address, _ in listening), listening
    url, *_ = setup
    port = int(url.rsplit(":", 1)[1])
    api_pid = next(
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and f"--port\0{port}\0".encode() in _cmdline(p)
    )
    assert socket_addresses(api_pid) == {(ipaddress.IPv4Address("127.0.0.1"), port)}


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def test_bodies_and_uploads_are_size_limited_with_or_without_content_length(setup):
    url, *_ = setup
    body = {"model": "spark", "input": "语" * 2000, "voice": "zh"}
    reply = httpx.post(f"{url}/v1/audio/speech", json=body, headers=auth(), timeout=60)
    assert reply.status_code == 413 and reply.json()["error"]["code"] == "request_too_large"

    def chunks():  # no Content-Length: the limit holds while the body arrives
        for _ in range(20):
            yield b"x" * 1000

    reply = httpx.post(f"{url}/v1/audio/speech", content=chunks(), headers=auth(), timeout=60)
    assert reply.status_code == 413, reply.text
    big = wav_bytes(load_wav_zeros(MAX_UPLOAD), 16000)
    files = {"audio_sample": ("a.wav", big)}
    reply = httpx.post(
        f"{url}/v1/audio/voices", data={"name": "big", "transcript": "x"}, files=files, headers=auth()
    )
    assert reply.status_code == 413


def load_wav_zeros(size_bytes: int):
    import numpy as np

    return np.full(size_bytes // 2 + 100, 0.1, dtype=np.float32)


@pytest.mark.parametrize(
    "name", ["../secret", "..%2Fsecret", "%2e%2e/secret", "/etc/passwd", "..\\secret", "voices/../../secret"]
)
def test_no_voice_name_reaches_outside_the_voices_folder(setup, prompt_zh, name):
    url, root, voices, _ = setup
    body = {"model": "spark", "input": "你好。", "voice": name, "response_format": "pcm"}
    reply = httpx.post(f"{url}/v1/audio/speech", json=body, headers=auth(), timeout=60)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "voice", reply.text
    before = sorted(p.name for p in root.iterdir())
    audio = wav_bytes(load_wav(prompt_zh, 16000)[:16000], 16000)
    data = {"name": name, "transcript": "x"}
    reply = httpx.post(
        f"{url}/v1/audio/voices", data=data, files={"audio_sample": ("a.wav", audio)}, headers=auth()
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "name", reply.text
    assert sorted(p.name for p in root.iterdir()) == before
    assert not Path("/etc/passwd.wav").exists()
