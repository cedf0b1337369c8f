"""Reading a model's statistics from the test session's tritonserver."""

from __future__ import annotations

import time

import tritonclient.http as httpclient


def inference_count(server, model: str) -> int:
    """Inferences the model has run (a batch of n counts n)."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return int(stats["inference_count"])


def inference_count_at_least(server, model: str, count: int, timeout: float = 15.0) -> int:
    """The model's inference count once it reaches `count` (or whatever it is after `timeout` seconds).

    A decoupled model's count goes up when Triton releases the request, which can come after the client has
    read the final response."""
    deadline = time.monotonic() + timeout
    while (current := inference_count(server, model)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return current
