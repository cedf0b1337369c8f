"""How a BLS model's `execute` runs its requests: inline (the default) or on worker threads."""

from __future__ import annotations

import threading

import pytest

from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.request_trace import trace_arguments


def test_inline_streams_run_one_after_another_before_execute_returns():
    order = []
    runner = RequestRunner()
    assert runner.execute(["a", "b"], decoupled=True, stream=order.append, offline=None) is None
    assert order == ["a", "b"]


def test_inline_offline_requests_answer_in_order():
    assert RequestRunner(1).execute([1, 2, 3], decoupled=False, stream=None, offline=lambda r: r * 10) == [
        10,
        20,
        30,
    ]


def test_worker_threads_return_before_the_streams_end_and_run_them_together():
    release = threading.Event()
    started = threading.Barrier(3, timeout=10)

    def stream(request):
        started.wait()
        release.wait(10)

    runner = RequestRunner(2)
    assert runner.execute(["a", "b"], decoupled=True, stream=stream, offline=None) is None
    started.wait()  # both requests run at once, after execute has returned
    release.set()
    runner.close()


def test_concurrency_below_one_is_refused():
    with pytest.raises(ValueError, match="max_concurrent_requests"):
        RequestRunner(0)


class TracedRequest:
    def __init__(self, name: str) -> None:
        self.name = name

    def trace(self) -> str:
        return f"trace of {self.name}"


@pytest.mark.parametrize("concurrency", [1, 3])
def test_the_models_a_request_calls_get_its_trace_on_any_thread(concurrency):
    seen: dict[str, dict] = {}
    done = threading.Barrier(3 if concurrency == 1 else 4, timeout=10)

    def stream(request):
        seen[request.name] = trace_arguments()
        if concurrency > 1:
            done.wait()

    runner = RequestRunner(concurrency)
    requests = [TracedRequest("a"), TracedRequest("b"), TracedRequest("c")]
    runner.execute(requests, decoupled=True, stream=stream, offline=None)
    if concurrency > 1:
        done.wait()
    runner.close()
    assert seen == {name: {"trace": f"trace of {name}"} for name in "abc"}
    assert trace_arguments() == {}
    offline = runner if concurrency == 1 else RequestRunner(1)
    assert offline.execute(
        ["untraced"], decoupled=False, stream=None, offline=lambda r: trace_arguments()
    ) == [{}]
