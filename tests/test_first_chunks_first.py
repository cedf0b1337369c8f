"""First chunks first (tritontts.triton.token2wav_calls): the token2wav models answer the streams' first chunks
before the later chunks queued with them, through each request's response sender, on the real tritonserver with
the tiny synthetic CosyVoice2 token2wav (`first_chunks_first` true and queue); and the groups Token2WavCalls makes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from cosyvoice2_models import PREFIX, TEMPLATES, build_cosyvoice2_models, checkpoint_paths, install_token2wav
from triton_stream import make_inputs
from waiting import wait_until

from tritontts.bench.server_stages import TOKEN2WAV_COUNT, scrape
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.stage_timer import StageTimer
from tritontts.triton.token2wav_calls import Token2WavCalls

TOKEN2WAV, QUEUED = PREFIX + "token2wav", PREFIX + "token2wav_queue"


def build_queued_token2wav(repo, data) -> None:
    model_dir = checkpoint_paths(data.parent / build_cosyvoice2_models.__name__).model_dir.resolve()
    install_token2wav(TEMPLATES, repo, QUEUED, model_dir, first_chunks_first="queue")


TRITON_MODELS = [build_cosyvoice2_models, build_queued_token2wav]
UNLOAD_AFTER = (QUEUED,)
BUSY_TOKENS = 1500
"""An offline call this long keeps the tiny token2wav busy for seconds on a CPU."""
BUSY_HEAD_START_S = 0.3


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(TOKEN2WAV, QUEUED)


def infer(server, model: str, values: dict, request_id: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(values), request_id=request_id)
        return result.as_numpy("waveform").reshape(-1)
    finally:
        client.close()


def first_chunk_executions(server, model: str) -> float:
    url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"
    return sum(
        value
        for (name, labels), value in scrape(url).items()
        if name == TOKEN2WAV_COUNT
        and dict(labels).get("model") == model
        and dict(labels).get("chunk") == "first"
    )


def _tokens(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, count).astype(np.int32)


@pytest.mark.parametrize("model", [TOKEN2WAV, QUEUED])
def test_a_first_chunk_queued_with_later_chunks_is_answered_before_them(server, model):
    """Stream Y has had its first chunk. While a long offline call keeps the model busy, X's first, Y's second
    and Z's first arrive (Triton batches them into the next execute; with `queue` they wait in the worker's
    queue): X's and Z's answers come before Y's, as one first-chunk group, and each first chunk is the audio it
    is alone."""
    y, x, z = _tokens(120, 1), _tokens(18, 2), _tokens(18, 3)
    idle = first_chunk_executions(server, model)
    infer(server, model, token2wav_arrays(y[:18], token_offset=0, finalize=False), request_id="y")
    before = wait_until(
        lambda: first_chunk_executions(server, model),
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
    busy = threading.Thread(target=infer, args=(server, model, token2wav_arrays(_tokens(BUSY_TOKENS, 4)), ""))
    busy.start()
    time.sleep(BUSY_HEAD_START_S)

    def call(stream: str) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            result = client.infer(model, make_inputs(calls[stream]), request_id=stream)
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
        lambda: first_chunk_executions(server, model),
        lambda count: count == before + 1,
        "X's and Z's first chunks counted as one first-chunk execution apart from Y's later chunk",
        timeout=10,
    )
    for stream in ("x", "z"):
        alone = infer(server, model, calls[stream], request_id=f"{stream}-alone")
        np.testing.assert_allclose(answered[stream][1], alone, atol=1e-5)
    for stream in ("x", "y", "z", "x-alone", "z-alone"):
        finalize = token2wav_arrays(_tokens(20, 9), token_offset=0, finalize=True)
        infer(server, model, finalize, request_id=stream)


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


def _calls(log: list, mode: str, run_many=None, group_max: int = 8) -> Token2WavCalls:
    def parse(request):
        if request.name == "bad":
            raise ValueError("refused")
        return request.name

    def record(calls, timer: StageTimer):
        log.append(list(calls))
        return [f"audio of {c}" for c in calls]

    return Token2WavCalls(
        _PbUtils,
        parse,
        run_many or record,
        _Stages(),
        lambda call: call.startswith("first"),
        lambda audio: audio,
        mode=mode,
        group_max=group_max,
    )


def _answers(requests: list[_Request]) -> dict[str, object]:
    """Each request's one response (every one sent with the final flag)."""
    assert all(len(r.sent) == 1 and r.sent[0][2] == 2 for r in requests)
    return {r.name: r.sent[0][1] for r in requests}


@pytest.mark.parametrize("mode", ["true", "false"])
def test_an_executes_first_chunks_run_as_their_own_group(mode):
    """Each request gets one final response; with `true` the first chunks run (and are answered) first."""
    log: list = []
    names = ["later-a", "first-b", "bad", "first-c", "later-d"]
    requests = [_Request(name) for name in names]
    calls = _calls(log, mode)
    assert calls.execute(requests) is None
    answers = _answers(requests)
    assert answers.pop("bad").error.message == "ValueError: refused"
    assert answers == {n: f"audio of {n}" for n in names if n != "bad"}
    if mode == "true":
        assert log == [["first-b", "first-c"], ["later-a", "later-d"]]
        assert [chunk for _, chunk in calls.stages.added] == ["first", "other"]
    else:
        assert log == [["later-a", "first-b", "first-c", "later-d"]]
        assert [chunk for _, chunk in calls.stages.added] == ["other"]


def _held_at_later_a(log: list, started: threading.Event, release: threading.Event):
    """A run_many that logs its groups and, on the group of later-a alone, sets `started` and waits for `release`."""

    def run_many(calls, timer):
        log.append(list(calls))
        if calls == ["later-a"]:
            started.set()
            release.wait(10)
        return [f"audio of {c}" for c in calls]

    return run_many


def test_the_queue_runs_every_waiting_first_chunk_before_the_next_group_of_later_calls():
    """While the worker runs later-a, five calls queue: the first chunks go next, then the later calls in groups
    of `group_max`, in arrival order; close() runs what is left and stops the worker."""
    log: list = []
    started, release = threading.Event(), threading.Event()
    run_many = _held_at_later_a(log, started, release)
    calls = _calls(log, "queue", run_many, group_max=2)
    requests = [_Request(n) for n in ("later-a", "later-b", "first-c", "later-d", "first-e", "later-f")]
    assert calls.execute(requests[:1]) is None
    assert started.wait(10)
    calls.execute(requests[1:3])
    calls.execute(requests[3:])
    assert all(not r.sent for r in requests[1:])
    release.set()
    calls.close()
    assert log == [["later-a"], ["first-c", "first-e"], ["later-b", "later-d"], ["later-f"]]
    assert _answers(requests) == {r.name: f"audio of {r.name}" for r in requests}
    assert not calls._worker.is_alive()


def test_first_chunks_past_group_max_run_in_groups_answered_one_after_another():
    """Five first chunks and a later chunk in one execute, groups of at most two: the first two are answered
    before the next group runs."""
    log: list = []
    requests = [_Request(n) for n in ("later-a", "first-b", "first-c", "first-d", "first-e", "first-f")]

    def run_many(calls, timer):
        log.append((list(calls), sorted(r.name for r in requests if r.sent)))
        return [f"audio of {c}" for c in calls]

    calls = _calls([], "true", run_many, group_max=2)
    calls.execute(requests)
    assert log == [
        (["first-b", "first-c"], []),
        (["first-d", "first-e"], ["first-b", "first-c"]),
        (["first-f"], ["first-b", "first-c", "first-d", "first-e"]),
        (["later-a"], ["first-b", "first-c", "first-d", "first-e", "first-f"]),
    ]
    assert _answers(requests) == {r.name: f"audio of {r.name}" for r in requests}


def test_the_queue_takes_at_most_group_max_first_chunks_a_group():
    log: list = []
    started, release = threading.Event(), threading.Event()
    run_many = _held_at_later_a(log, started, release)
    calls = _calls(log, "queue", run_many, group_max=2)
    requests = [_Request(n) for n in ("later-a", "first-b", "later-c", "first-d", "first-e")]
    calls.execute(requests[:1])
    assert started.wait(10)
    calls.execute(requests[1:])
    release.set()
    calls.close()
    assert log == [["later-a"], ["first-b", "first-d"], ["first-e"], ["later-c"]]
    assert _answers(requests) == {r.name: f"audio of {r.name}" for r in requests}


@pytest.mark.parametrize("mode", ["true", "queue"])
def test_a_group_that_fails_answers_its_requests_with_the_error_and_the_rest_still_run(mode):
    requests = [_Request("first-a"), _Request("later-b")]

    def run_many(calls, timer):
        if calls[0].startswith("first"):
            raise RuntimeError("CUDA error: out of memory")
        return ["audio"]

    calls = _calls([], mode, run_many)
    calls.execute(requests)
    calls.close()
    answers = _answers(requests)
    assert "RuntimeError: CUDA error: out of memory" in answers["first-a"].error.message
    assert answers["later-b"] == "audio"


def _audio_calls(mode: str, **options) -> Token2WavCalls:
    """Token2WavCalls whose every call is answered "audio" (requests parsed to their names)."""
    return Token2WavCalls(
        _PbUtils,
        lambda r: r.name,
        lambda calls, timer: ["audio"] * len(calls),
        _Stages(),
        lambda c: c.startswith("first"),
        lambda a: a,
        mode=mode,
        **options,
    )


@pytest.mark.parametrize("mode", ["true", "queue"])
def test_close_gives_up_the_holders_slot(mode):
    class Holder:
        def __init__(self) -> None:
            self.events: list[str] = []

        def hold(self) -> None:
            self.events.append("hold")

        def release(self) -> None:
            self.events.append("release")

        def close(self) -> None:
            self.events.append("close")

    holder = Holder()
    calls = _audio_calls(mode, holder=holder)
    request = _Request("first-a")
    calls.execute([request])
    calls.close()
    assert _answers([request]) == {"first-a": "audio"}
    assert holder.events == ["hold", "release", "close"]


def _cuda_calls(monkeypatch, set_device) -> Token2WavCalls:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return _audio_calls("queue", device=torch.device("cuda"))


def test_the_queue_worker_takes_the_gpu_current_where_it_was_built_for_a_device_without_index(monkeypatch):
    """A bare `cuda` device (run.sh's device auto on a GPU host): the worker makes the index current then, not
    the device, which torch.cuda.set_device refuses."""
    taken: list = []
    calls = _cuda_calls(monkeypatch, taken.append)
    request = _Request("first-a")
    calls.execute([request])
    calls.close()
    assert taken == [3]
    assert _answers([request]) == {"first-a": "audio"}


def test_a_queue_worker_that_cannot_take_its_gpu_answers_every_call_with_the_error(monkeypatch):
    def set_device(index):
        raise RuntimeError("CUDA error: invalid device ordinal")

    calls = _cuda_calls(monkeypatch, set_device)
    requests = [_Request("first-a"), _Request("later-b")]
    calls.execute(requests[:1])
    calls.execute(requests[1:])
    calls.close()
    assert all("invalid device ordinal" in answer.error.message for answer in _answers(requests).values())
