"""A small gRPC streaming helper for tests: one stream per request, responses collected with timestamps."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype


def make_inputs(arrays: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, value in arrays.items():
        tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


@dataclass
class StreamResult:
    outputs: list[dict[str, np.ndarray]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # arrival of each data response
    error: str | None = None
    started: float = 0.0
    finished: float = 0.0


class Stream:
    """Sends one request on its own gRPC stream; `read()` collects until the final response."""

    def __init__(
        self,
        url: str,
        model: str,
        arrays: dict[str, np.ndarray],
        outputs: list[str],
        parameters: dict | None = None,
    ) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.events: queue.Queue = queue.Queue()
        self.outputs = outputs
        self.result = StreamResult(started=time.monotonic())
        self.client.start_stream(
            callback=lambda result, error: self.events.put((result, error, time.monotonic()))
        )
        self.client.async_stream_infer(
            model,
            make_inputs(arrays),
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
            parameters=parameters,
            enable_empty_final_response=True,
        )

    def read(self, limit: int | None = None, timeout: float = 120.0) -> StreamResult:
        """Collect responses until the final one (or `limit` data responses); then close unless limited."""
        while limit is None or len(self.result.outputs) < limit:
            result, error, arrived = self.events.get(timeout=timeout)
            if error is not None:
                self.result.error = str(error)
                break
            response = result.get_response()
            if result.as_numpy(self.outputs[0]) is not None:
                self.result.outputs.append({n: result.as_numpy(n) for n in self.outputs})
                self.result.times.append(arrived)
            if response.parameters["triton_final_response"].bool_param:
                break
        self.result.finished = time.monotonic()
        if limit is None or self.result.error:
            self.client.stop_stream()
            self.client.close()
        return self.result

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()


def stream_waveforms(
    url: str, model: str, values: dict[str, np.ndarray], parameters: dict
) -> list[np.ndarray]:
    """Every `waveform` of one streamed request, in order; an error response is raised as the exception."""
    client = grpcclient.InferenceServerClient(url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    chunks = []
    try:
        client.async_stream_infer(
            model, make_inputs(values), parameters=parameters, enable_empty_final_response=True
        )
        while True:
            result, error = events.get(timeout=300)
            if error is not None:
                raise error
            if result.as_numpy("waveform") is not None:
                chunks.append(result.as_numpy("waveform").reshape(-1))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return chunks
    finally:
        client.stop_stream()
        client.close()


def stream_responses(server, model: str, values: dict, outputs: list[str], parameters: dict) -> list[dict]:
    """Every data response of one streamed request (the profile of a decoupled BLS comes as one)."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    events: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    responses = []
    try:
        client.async_stream_infer(
            model,
            make_inputs(values),
            outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
            parameters=parameters,
            enable_empty_final_response=True,
        )
        while True:
            result, error = events.get(timeout=300)
            if error is not None:
                raise error
            if result.as_numpy(outputs[0]) is not None:
                responses.append({n: result.as_numpy(n) for n in outputs})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()
