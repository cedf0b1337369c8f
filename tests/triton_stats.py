"""Reading models' statistics from the test session's tritonserver.

Triton counts a request a moment after it has answered it (a decoupled one when it releases the request, after
the final response), so a test never compares a count read right after a response: `assert_counts` waits until
each count has reached what the test expects, then asserts equality (an over-count still fails). Counts that must
not change are read once the model that served the request has counted it (`over`): the request is over, and a
model it called counted that call right after answering it, while the caller still had its own work to finish.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import tritonclient.http as httpclient
from waiting import wait_until


def _model_stats(server, model: str) -> dict:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


def inference_count(server, model: str) -> int:
    """Inferences the model has run (a batch of n counts n)."""
    return int(_model_stats(server, model)["inference_count"])


def success_count(server, model: str) -> int:
    """Requests the model has answered successfully."""
    return int(_model_stats(server, model)["inference_stats"]["success"].get("count", 0))


def inference_counts(
    server, models: Iterable[str], count: Callable[[object, str], int] = inference_count
) -> dict[str, int]:
    return {model: count(server, model) for model in models}


def wait_for_counts(
    server,
    at_least: Mapping[str, int],
    timeout: float = 60.0,
    count: Callable[[object, str], int] = inference_count,
) -> dict[str, int]:
    """The counts of `at_least`'s models once each has reached its value there; after `timeout` seconds
    (scaled, waiting.wait_until) an AssertionError with what they last read."""
    return wait_until(
        lambda: inference_counts(server, at_least, count),
        lambda counts: all(counts[m] >= n for m, n in at_least.items()),
        f"{count.__name__} of {dict(at_least)} at least",
        timeout=timeout,
    )


def assert_counts(
    server,
    expected: Mapping[str, int],
    over: Mapping[str, int] | None = None,
    timeout: float = 60.0,
    count: Callable[[object, str], int] = inference_count,
) -> None:
    """Each model's count is exactly its value in `expected`, read once every one has reached it and each model
    of `over` has reached its count there (the model that served the request: it is over; see the module)."""
    counts = wait_for_counts(server, {**(over or {}), **expected}, timeout, count)
    got = {model: counts[model] for model in expected}
    assert got == dict(expected), f"{count.__name__}: expected {dict(expected)}, got {got}"


def inference_count_at_least(server, model: str, count: int, timeout: float = 15.0) -> int:
    """The model's inference count once it reaches `count` (an AssertionError after `timeout` seconds)."""
    return wait_for_counts(server, {model: count}, timeout)[model]
