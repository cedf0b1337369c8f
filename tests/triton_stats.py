"""Reading a model's statistics from the test session's tritonserver."""

from __future__ import annotations

import tritonclient.http as httpclient


def inference_count(server, model: str) -> int:
    """Inferences the model has run (a batch of n counts n)."""
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()
    return int(stats["inference_count"])
