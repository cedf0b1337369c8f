"""First chunks first (tritontts.triton.batched_flow): the token2wav models answer the streams' first chunks of
an execute before its later chunks, through each request's response sender, on the real tritonserver with the
tiny synthetic CosyVoice2 token2wav; and the ordering of execute_batched itself."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from triton_stream import make_inputs
from waiting import wait_until

from tritontts.bench.server_stages import TOKEN2WAV_COUNT, scrape
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.stage_timer import StageTimer
from tritontts.triton.batched_flow import execute_batched

TOKEN2WAV = PREFIX + "token2wav"
TRITON_MODELS = [build_cosyvoice2_models]
BUSY_TOKENS = 1500
"""An offline call this long keeps the tiny token2wav busy for seconds on a CPU."""
BUSY_HEAD_START_S = 0.3


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(TOKEN2WAV)


def infer(server, model: str, values: dict, request_id: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(values), request_id=request_id)
        return result.as_numpy("waveform").reshape(-1)
    finally:
        client.close()


def first_chunk_executions(server) -> float:
    url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"
    return sum(
        value
        for (name, labels), value in scrape(url).items()
        if name == TOKEN2WAV_COUNT
        and dict(labels).get("model") == TOKEN2WAV
        and dict(labels).get("chunk") == "first"
    )


def _tokens(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, count).astype(np.int32)


def test_a_first_chunk_batched_with_later_chunks_is_answered_before_them(server):
    """Stream Y has had its first chunk. While a long offline call keeps the model busy, X's first, Y's second
    and Z's first arrive, so Triton batches them into the next execute: X's and Z's answers come before Y's,
    and each first chunk is the audio it is alone."""
    y, x, z = _tokens(120, 1), _tokens(18, 2), _tokens(18, 3)
    idle = first_chunk_executions(server)
    infer(server, TOKEN2WAV, token2wav_arrays(y[:18], token_offset=0, finalize=False), request_id="y")
    before = wait_until(
        lambda: first_chunk_executions(server),
        lambda count: count == idle + 1,
        "Y's first chunk counted as a first-chunk execution",
        timeout=10,
    )
    calls = {
        "x": token2wav_arrays(x, token_offset=0, finalize=False),
        "y": token2wav_arrays(y[:43], token_offset=15, finalize=False),
        "z": token2wav_arrays(z, token_offset=0, finalize=False),
    }
    answered: dict[str, tuple[float, np.ndarray]] = {}
    busy = threading.Thread(
        target=infer, args=(server, TOKEN2WAV, token2wav_arrays(_tokens(BUSY_TOKENS, 4)), "")
    )
    busy.start()
    time.sleep(BUSY_HEAD_START_S)

    def call(stream: str) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            result = client.infer(TOKEN2WAV, make_inputs(calls[stream]), request_id=stream)
            answered[stream] = (time.monotonic(), result.as_numpy("waveform").reshape(-1))
        finally:
            client.close()

    threads = [threading.Thread(target=call, args=(stream,)) for stream in calls]
    for thread in threads:
        thread.start()
    for thread in [*threads, busy]:
        thread.join(timeout=300)
    assert set(answered) == set(calls)
    assert answered["x"][0] < answered["y"][0] and answered["z"][0] < answered["y"][0]
    wait_until(
        lambda: first_chunk_executions(server),
        lambda count: count == before + 1,
        "X's and Z's first chunks counted as one first-chunk execution apart from Y's later chunk",
        timeout=10,
    )
    for stream in ("x", "z"):
        alone = infer(server, TOKEN2WAV, calls[stream], request_id=f"{stream}-alone")
        np.testing.assert_allclose(answered[stream][1], alone, atol=1e-5)
    for stream in ("x", "y", "z", "x-alone", "z-alone"):
        finalize = token2wav_arrays(_tokens(20, 9), token_offset=0, finalize=True)
        infer(server, TOKEN2WAV, finalize, request_id=stream)


@dataclass
class _Request:
    name: str
    sent: list = field(default_factory=list)

    def get_response_sender(self):
        return self

    def send(self, response, flags=0):
        self.sent.append((self.name, response, flags))


class _PbUtils:
    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 2

    class TritonError:
        def __init__(self, message, code=None):
            self.message = message

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.error = error


class _Stages:
    def __init__(self) -> None:
        self.added: list[tuple[dict, str]] = []

    def add(self, stages: dict, chunk: str) -> None:
        self.added.append((stages, chunk))


@pytest.mark.parametrize("first_chunks_first", [True, False])
def test_execute_batched_runs_first_chunks_as_their_own_group(first_chunks_first):
    """Each request gets one final response; with the switch the first chunks run (and are answered) first."""
    log: list = []
    names = ["later-a", "first-b", "bad", "first-c", "later-d"]
    requests = [_Request(name) for name in names]

    def parse(request):
        if request.name == "bad":
            raise ValueError("refused")
        return request.name

    def run_many(calls, timer: StageTimer):
        log.append(list(calls))
        return [f"audio of {c}" for c in calls]

    stages = _Stages()
    result = execute_batched(
        _PbUtils,
        requests,
        parse,
        run_many,
        stages,
        lambda call: call.startswith("first"),
        lambda audio: audio,
        first_chunks_first=first_chunks_first,
    )
    assert result is None
    sent = [entry for request in requests for entry in request.sent]
    assert len(sent) == len(names) and all(flags == 2 for _, _, flags in sent)
    assert [r.sent[0][1] for r in requests if r.name != "bad"] == [
        f"audio of {n}" for n in names if n != "bad"
    ]
    assert requests[2].sent[0][1].error.message == "ValueError: refused"
    if first_chunks_first:
        assert log == [["first-b", "first-c"], ["later-a", "later-d"]]
        assert [chunk for _, chunk in stages.added] == ["first", "other"]
    else:
        assert log == [["later-a", "first-b", "first-c", "later-d"]]
        assert [chunk for _, chunk in stages.added] == ["other"]


def test_a_group_that_fails_answers_its_requests_with_the_error_and_the_rest_still_run():
    requests = [_Request("first-a"), _Request("later-b")]

    def run_many(calls, timer):
        if calls[0].startswith("first"):
            raise RuntimeError("CUDA error: out of memory")
        return ["audio"]

    execute_batched(
        _PbUtils,
        requests,
        lambda r: r.name,
        run_many,
        _Stages(),
        lambda c: c.startswith("first"),
        lambda a: a,
    )
    assert "RuntimeError: CUDA error: out of memory" in requests[0].sent[0][1].error.message
    assert requests[1].sent[0][1] == "audio"
