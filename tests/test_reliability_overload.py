"""Scenario 3 of the reliability suite: overload.

What must hold: 4x the capacity of `rel_spark_tts_busy` (one BLS instance and a queue of 2: 3 requests) at
once over gRPC: each request completes or is rejected with "Exceeds maximum queue size" (UNAVAILABLE) before any
accepted one has finished, none hangs; a request whose queue timeout passes is rejected; through the speech API
Triton's rejection is a 503 with Retry-After, and the API's own limit (--max-concurrent-requests) a 429 with
Retry-After; afterwards the next requests succeed (no deadlock). Latencies of the accepted requests go to the
soak report (scripts/soak.py), not into assertions.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from reliability_models import (
    BUSY_MAX_NEW_TOKENS,
    BUSY_QUEUE,
    SPARK_BUSY,
    SPARK_MODELS,
    SPARK_OFFLINE,
    build_reliability_models,
    knob,
    loaded,
    metric_values,
    percentiles,
    read_outcome,
    record,
    reference_fixture,
    spark_arrays,
    speech_api,
)
from triton_stream import Stream, make_inputs
from waiting import wait_until

from tritontts.openai_api.triton_client import OVERLOAD_MESSAGES

TRITON_MODELS = [build_reliability_models]
pytestmark = pytest.mark.reliability
CAPACITY = 1 + BUSY_QUEUE
FORCED = {"min_new_tokens": BUSY_MAX_NEW_TOKENS, "max_new_tokens": BUSY_MAX_NEW_TOKENS}  # a long request
API_LIMIT = 2


server = loaded(*SPARK_MODELS)


reference = reference_fixture()


@pytest.fixture(scope="module")
def api(server, tmp_path_factory, prompt_zh):
    limits = ["--retry-after", "3", "--max-concurrent-requests", str(API_LIMIT)]
    routes = {"busy": SPARK_BUSY, "offline": SPARK_OFFLINE}
    with speech_api(server.grpc_url, tmp_path_factory, prompt_zh, *limits, **routes) as (url, _):
        yield url


def test_four_times_the_capacity_completes_or_is_rejected_at_once(server, reference):
    arrays = spark_arrays(reference)
    ended: list[tuple[float, str, str]] = []
    lock = threading.Lock()

    def one(_):
        began = time.monotonic()
        outcome = read_outcome(Stream(server.grpc_url, SPARK_BUSY, arrays, ["waveform"]), 120)
        with lock:
            ended.append((time.monotonic(), *outcome, time.monotonic() - began))
        return outcome

    rounds = int(knob("overload_rounds", 1))
    outcomes = []
    for _ in range(rounds):
        with ThreadPoolExecutor(4 * CAPACITY) as pool:
            outcomes += list(pool.map(one, range(4 * CAPACITY)))
    record(
        "overload",
        capacity=CAPACITY,
        sent=len(outcomes),
        concurrency=4 * CAPACITY,
        accepted=sum(o[0] == "ok" for o in outcomes),
        rejected=sum(o[0] == "error" for o in outcomes),
        hung=sum(o[0] == "hang" for o in outcomes),
        accepted_latency_s=percentiles([e[3] for e in ended if e[1] == "ok"]),
        rejected_latency_s=percentiles([e[3] for e in ended if e[1] == "error"]),
    )
    assert not [o for o in outcomes if o[0] == "hang"], outcomes
    rejected = [m for kind, m in outcomes if kind == "error"]
    assert all("Exceeds maximum queue size" in m for m in rejected), rejected
    assert CAPACITY * rounds <= len(outcomes) - len(rejected) and len(rejected) >= CAPACITY * rounds, outcomes
    first_round = sorted(ended)[: 4 * CAPACITY]
    first_done = min(e[0] for e in first_round if e[1] == "ok")
    assert all(e[0] < first_done for e in first_round if e[1] == "error"), "a rejection waited for the queue"
    again = [read_outcome(Stream(server.grpc_url, SPARK_BUSY, arrays, ["waveform"]), 120) for _ in range(2)]
    assert [o[0] for o in again] == ["ok", "ok"], again


def test_a_request_past_its_queue_timeout_is_rejected(server, reference):
    arrays = spark_arrays(reference)
    busy = Stream(server.grpc_url, SPARK_BUSY, arrays, ["waveform"], parameters=FORCED)  # the only instance
    assert busy.read(limit=1, timeout=120).error is None
    late = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: late.put(error))
    try:
        client.async_stream_infer(SPARK_BUSY, make_inputs(arrays), timeout=1000)  # 1 ms in the queue at most
        error = late.get(timeout=120)
    finally:
        client.stop_stream()
        client.close()
    # the message the speech API answers 503 + Retry-After for (tritontts.openai_api.triton_client)
    assert error is not None and "Request timeout expired" in str(error), error
    assert "Request timeout expired" in OVERLOAD_MESSAGES
    assert read_outcome(busy, 120)[0] == "ok"


def test_the_api_answers_overload_with_429_or_503_and_retry_after(api):
    body = {"model": "busy", "input": "身临其境，换新体验。", "voice": "zh", "response_format": "pcm"}

    def post(model: str) -> httpx.Response:
        return httpx.post(f"{api}/v1/audio/speech", json=body | {"model": model}, timeout=300)

    with ThreadPoolExecutor(4 * API_LIMIT) as pool:
        replies = list(pool.map(post, ["offline"] * (4 * API_LIMIT)))
    codes = sorted(r.status_code for r in replies)
    assert set(codes) <= {200, 429} and codes.count(200) >= API_LIMIT and 429 in codes, codes
    limited = next(r for r in replies if r.status_code == 429)
    assert limited.headers["retry-after"] == "3", limited.headers
    assert limited.json()["error"]["code"] == "rate_limit_exceeded", limited.json()
    for reply in replies:
        if reply.status_code == 200:
            assert np.frombuffer(reply.content, "<i2").size > 0


def pending_requests(server, model: str) -> float:
    """Requests of `model` waiting in Triton's queue (nv_inference_pending_request_count: not the running one)."""
    values = metric_values(server.server, "nv_inference_pending_request_count")
    return sum(v for labels, v in values.items() if f'model="{model}"' in labels)


def ended(stream: Stream) -> bool:
    """Whether the stream's final response (or an error) has come, among the responses not read yet."""
    with stream.events.mutex:  # the stream's callback thread adds to it
        unread = list(stream.events.queue)
    return any(
        error is not None or result.get_response().parameters["triton_final_response"].bool_param
        for result, error, _ in unread
    )


def test_a_full_triton_queue_is_a_503_with_retry_after(server, reference, api):
    """The overload is made, not raced for: the one instance of rel_spark_tts_busy runs a stream forced to
    BUSY_MAX_NEW_TOKENS tokens (several chunks), seen running by its first chunk; then BUSY_QUEUE more requests are
    sent and seen waiting in Triton's queue (its pending count). Only then does the API's request go: while that
    stream runs, the queue is full, on a machine of any speed. Were the API's request to come after the stream's
    end (it has hundreds of tokens left to make, the API's request none), the failure says when its chunks came."""
    body = {"model": "busy", "input": "身临其境，换新体验。", "voice": "zh", "response_format": "pcm"}
    arrays = spark_arrays(reference)
    idle = f"no request waiting in the queue of {SPARK_BUSY}"
    wait_until(lambda: pending_requests(server, SPARK_BUSY), lambda n: n == 0, idle)  # an earlier test's
    running = Stream(server.grpc_url, SPARK_BUSY, arrays, ["waveform"], parameters=FORCED)
    assert running.read(limit=1, timeout=120).error is None  # it holds the only instance
    assert pending_requests(server, SPARK_BUSY) == 0  # the running request is not counted as pending
    queued = [Stream(server.grpc_url, SPARK_BUSY, arrays, ["waveform"]) for _ in range(BUSY_QUEUE)]
    waiting = wait_until(
        lambda: pending_requests(server, SPARK_BUSY),
        lambda n: n >= BUSY_QUEUE,
        f"{BUSY_QUEUE} requests waiting in the queue of {SPARK_BUSY}",
    )
    assert waiting == BUSY_QUEUE, waiting
    assert not ended(running), "the forced stream ended before the API's request: raise BUSY_MAX_NEW_TOKENS"
    reply = httpx.post(f"{api}/v1/audio/speech", json=body, timeout=300)
    replied = time.monotonic()
    held = read_outcome(running, 120)
    assert reply.status_code == 503, (
        f"{reply.status_code} {reply.text[:300]}; the running stream ({held}) sent its chunks "
        f"{[round(t - replied, 2) for t in running.result.times]} s after the API's answer"
    )
    assert reply.headers["retry-after"] == "3"
    assert (
        reply.json()["error"]["code"] == "server_overloaded" and "queue" in reply.json()["error"]["message"]
    )
    assert held[0] == "ok", held
    assert [read_outcome(q, 120)[0] for q in queued] == ["ok"] * BUSY_QUEUE
    assert httpx.post(f"{api}/v1/audio/speech", json=body, timeout=300).status_code == 200
