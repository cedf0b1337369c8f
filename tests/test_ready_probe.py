"""The readiness probe (`answers_ok`) says "not ready" to whatever is not an HTTP 200, including a peer that
answers no HTTP at all: a probe of a free port in the ephemeral range can connect to itself and read back its own
request line, which stopped run.sh stage 7 once (http.client.BadStatusLine) instead of waiting for the server."""

from __future__ import annotations

import socket
import threading

from tritontts.triton.server import answers_ok


def serve_once(reply: bytes) -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer() -> None:
        conn, _ = listener.accept()
        with conn, listener:
            conn.recv(4096)
            conn.sendall(reply)

    threading.Thread(target=answer, daemon=True).start()
    return listener.getsockname()[1]


def test_a_reply_that_is_not_http_is_not_ready():
    port = serve_once(b"GET /v2/health/ready HTTP/1.1\r\n\r\n")  # what a self-connected probe reads
    assert answers_ok(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) is False


def test_a_200_is_ready_and_a_503_is_not():
    ok = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert answers_ok(f"http://127.0.0.1:{ok}/v2/health/ready", timeout=5) is True
    busy = serve_once(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    assert answers_ok(f"http://127.0.0.1:{busy}/v2/health/ready", timeout=5) is False
