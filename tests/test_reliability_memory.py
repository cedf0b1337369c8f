"""Scenario 9 of the reliability suite: where tritonserver's own memory goes, per kind of request.

What must hold: offline requests over one reused gRPC client leave tritonserver's resident memory (VmRSS) within
10% of its level after a warm-up (a few requests of every kind first: the server's
one-time growth comes with whichever kind runs first). What is recorded besides (no bound: tritonserver 2.51's
behaviour, not ours): the KiB per request that stay with tritonserver and with each stub, by part (total VmRSS,
RssAnon, RssFile, RssShmem), for offline requests over a new client each, completed streams and cancelled
streams (each from its own client, as the suite's other scenarios send them). CI: 12 requests of the bounded
kind at concurrency 4 (the recorded kinds only where scripts/soak.py collects the figures); scripts/soak.py:
every kind, `--memory-requests` of each.
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
    reporting,
    resident_parts,
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

    kinds: dict[str, Callable[[], None]] = {"offline_one_reused_client": lambda: offline(shared)}
    if reporting():  # figures without a bound: only where a report keeps them
        kinds |= {
            "offline_new_client_each": lambda: offline(None),
            "stream_completed": lambda: stream(False),
            "stream_cancelled_after_first_chunk": lambda: stream(True),
        }
    figures = {}
    try:
        for send in kinds.values():  # the server's one-time growth (buffers, arenas) before any level is read
            run_kind(server, send, WARMUP)
        for name, send in kinds.items():
            level = resident_parts(server.server.pid)
            after = run_kind(server, send, requests)
            figures[name] = per_request(level, after, requests)
    finally:
        shared.close()
    record("tritonserver_memory_per_request", requests=requests, concurrency=CONCURRENCY, kinds=figures)
    reused = figures["offline_one_reused_client"]
    assert reused["after_mib"] <= reused["level_mib"] * (1 + SLACK), reused


def run_kind(server, send: Callable[[], None], count: int) -> dict[str, dict[str, int]]:
    """Send `count` requests at CONCURRENCY; the resident bytes by process and part once they have settled."""
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda _: send(), range(count)))
    time.sleep(2)
    return resident_parts(server.server.pid)


def per_request(level: dict[str, dict[str, int]], after: dict[str, dict[str, int]], requests: int) -> dict:
    """tritonserver's total and private anonymous MiB before and after, and the KiB per request that stayed
    with each process, by part."""
    server_level, server_after = level["tritonserver"], after["tritonserver"]
    kib = {
        process: {
            part: round((after[process][part] - was) / 1024 / requests, 1) for part, was in parts.items()
        }
        for process, parts in level.items()
        if process in after
    }
    return {
        "level_mib": round(server_level["total"] / 2**20, 1),
        "after_mib": round(server_after["total"] / 2**20, 1),
        "kib_per_request": kib["tritonserver"]["total"],
        "level_anon_mib": round(server_level["anon"] / 2**20, 1),
        "after_anon_mib": round(server_after["anon"] / 2**20, 1),
        "kib_per_request_by_part": kib,
    }
