"""Scenario 9 of the reliability suite: where tritonserver's own memory goes, per kind of request.

What must hold: offline requests over one reused gRPC client leave tritonserver's resident memory within 10% of
its level after a warm-up (a few requests of every kind first: the server's one-time growth comes with whichever
kind runs first). What is recorded besides (no bound: tritonserver 2.51's behaviour, not ours): the KB
per request that stay with tritonserver for offline requests over a new client each, completed streams and
cancelled streams (each from its own client, as the suite's other scenarios send them). CI: 12 requests of each
kind at concurrency 4; scripts/soak.py: `--memory-requests`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
import tritonclient.grpc as grpcclient
from reliability_models import (
    SPARK_MODELS,
    SPARK_OFFLINE,
    SPARK_STREAM,
    build_reliability_models,
    knob,
    loaded,
    read_outcome,
    record,
    reference_fixture,
    rss_bytes,
    spark_arrays,
)
from triton_stream import Stream, make_inputs

TRITON_MODELS = [build_reliability_models]
pytestmark = pytest.mark.reliability
CONCURRENCY = 4
WARMUP = 8
SLACK = 0.10


server = loaded(*SPARK_MODELS)


reference = reference_fixture()


def test_tritonserver_memory_per_request_kind(server, reference):
    requests = int(knob("memory_requests", 12))
    arrays = spark_arrays(reference)
    shared = grpcclient.InferenceServerClient(server.grpc_url)

    def offline(client: grpcclient.InferenceServerClient | None) -> None:
        own = client or grpcclient.InferenceServerClient(server.grpc_url)
        try:
            assert own.infer(SPARK_OFFLINE, make_inputs(arrays), client_timeout=300).as_numpy("waveform").size
        finally:
            if client is None:
                own.close()

    def stream(cancel: bool) -> None:
        s = Stream(server.grpc_url, SPARK_STREAM, arrays, ["waveform"])
        if cancel:
            s.read(limit=1, timeout=120)
            s.cancel()
        else:
            assert read_outcome(s, 120)[0] == "ok"

    kinds: dict[str, Callable[[], None]] = {
        "offline_one_reused_client": lambda: offline(shared),
        "offline_new_client_each": lambda: offline(None),
        "stream_completed": lambda: stream(False),
        "stream_cancelled_after_first_chunk": lambda: stream(True),
    }
    figures = {}
    try:
        for send in kinds.values():  # the server's one-time growth (buffers, arenas) before any level is read
            run_kind(server, send, WARMUP)
        for name, send in kinds.items():
            level = rss_bytes(server.server.pid)["tritonserver"]
            after = run_kind(server, send, requests)
            figures[name] = {
                "level_mib": round(level / 2**20, 1),
                "after_mib": round(after / 2**20, 1),
                "kib_per_request": round((after - level) / 1024 / requests, 1),
            }
    finally:
        shared.close()
    record("tritonserver_memory_per_request", requests=requests, concurrency=CONCURRENCY, kinds=figures)
    reused = figures["offline_one_reused_client"]
    assert reused["after_mib"] <= reused["level_mib"] * (1 + SLACK), reused


def run_kind(server, send: Callable[[], None], count: int) -> int:
    """Send `count` requests at CONCURRENCY; tritonserver's resident bytes once they have settled."""
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda _: send(), range(count)))
    time.sleep(2)
    return rss_bytes(server.server.pid)["tritonserver"]
