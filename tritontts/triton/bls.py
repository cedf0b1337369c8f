"""Calls from a python-backend model into other models of the same server (BLS), as numpy in, numpy out.

`pb_utils` (triton_python_backend_utils) exists only inside the stub, so it is passed in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tritontts.triton.llm_contract import OUTPUT_NAMES, generated_tokens, llm_request_inputs
from tritontts.triton.request_trace import trace_arguments
from tritontts.triton.stub_objects import hold_until_stub_done
from tritontts.triton.stubs import callee_monitor

log = logging.getLogger(__name__)


class ModelCallError(RuntimeError):
    """A model called through BLS answered with an error."""


def _request(
    pb_utils: Any,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    request_id: str | None = None,
    sequence_flags: int | None = None,
) -> Any:
    tensors = [pb_utils.Tensor(name, np.ascontiguousarray(value)) for name, value in inputs.items()]
    extra = trace_arguments() | ({} if request_id is None else {"request_id": request_id})
    if sequence_flags is not None and request_id:
        extra |= {"correlation_id": request_id, "flags": sequence_flags}
    return pb_utils.InferenceRequest(
        model_name=model, requested_output_names=list(outputs), inputs=tensors, **extra
    )


def _outputs(pb_utils: Any, model: str, response: Any, outputs: Sequence[str]) -> dict[str, np.ndarray]:
    if response.has_error():
        raise ModelCallError(f"{model}: {response.error().message()}")
    result = {}
    for name in outputs:
        tensor = pb_utils.get_output_tensor_by_name(response, name)
        if tensor is None:
            raise ModelCallError(f"{model} returned no '{name}'")
        # a copy: as_numpy() is a view of the response's block in the stub's shared-memory pool, which a kept
        # array (a cached voice's tokens or embedding) would hold for as long as it lives
        result[name] = np.array(tensor.as_numpy()) if tensor.is_cpu() else _gpu_to_numpy(tensor)
    return result


def _gpu_to_numpy(tensor: Any) -> np.ndarray:
    from torch.utils.dlpack import from_dlpack

    return from_dlpack(tensor.to_dlpack()).cpu().numpy()


def call_model(
    pb_utils: Any,
    model: str,
    inputs: Mapping[str, np.ndarray],
    outputs: Sequence[str],
    request_id: str | None = None,
    sequence_flags: int | None = None,
) -> dict[str, np.ndarray]:
    """One request, one response; `request_id` ties calls together (a stream's token2wav calls), and with
    `sequence_flags` it is also the correlation id a sequence batcher routes by."""
    with callee_monitor().watching(model):
        response = _request(pb_utils, model, inputs, outputs, request_id, sequence_flags).exec()
    return _outputs(pb_utils, model, response, outputs)


def stream_model(
    pb_utils: Any, model: str, inputs: Mapping[str, np.ndarray], outputs: Sequence[str], decoupled: bool
) -> Iterator[dict[str, np.ndarray]]:
    """Every response of a request to a decoupled model (or the one response of a plain one).

    Closing the generator before the end (a client that cancelled) cancels the request where the python backend
    can (r24.11 on: the response iterator's `cancel()`), then always reads the responses still coming up to the
    final one, here and now: the stub frees a stream's responses (and the parent its payload) only once they have
    all been read. The stub of tritonserver 2.51 (r24.10) has no `cancel()`, so there the callee runs to its end
    and this waits for it; an abandoned iterator instead kept every late response of every cancelled stream in the
    stub's shared-memory pool and heap (the pool grew with each cancelled stream).
    """
    if not decoupled:
        yield call_model(pb_utils, model, inputs, outputs)
        return
    with callee_monitor().watching(model):  # the callee's stub dying ends this stub: see CalleeMonitor
        request = _request(pb_utils, model, inputs, outputs)
        responses = request.exec(decoupled=True)
        hold_until_stub_done((request, responses))  # see tritontts.triton.stub_objects
        finished = False
        try:
            for response in responses:
                if (
                    response.has_error()
                    or pb_utils.get_output_tensor_by_name(response, outputs[0]) is not None
                ):
                    yield _outputs(pb_utils, model, response, outputs)
            finished = True
        finally:
            if not finished:
                drain(responses, model)


def drain(responses: Any, model: str) -> None:
    """Cancel an abandoned decoupled call where the stub can, and read its responses to the final one."""
    cancel = getattr(responses, "cancel", None)  # python_backend r24.11 on; absent from 2.51's stub
    try:
        if cancel is not None:
            cancel()
        for _ in responses:
            pass
    except Exception:  # never hide why the stream ended; the rest is the stub's to free
        log.exception("%s: reading the responses of an abandoned call failed", model)


def generate_tokens(
    pb_utils: Any,
    model: str,
    prompt_ids: np.ndarray,
    params: Any,
    end_id: int,
    pad_id: int,
    streaming: bool,
    decoupled: bool,
) -> Iterator[np.ndarray]:
    """New token ids from a `tensorrt_llm`-contract model: every streamed piece, or the whole output once
    (`params.bad_token_ids`, where it has them, go as `bad_words_list`)."""
    bad_ids = getattr(params, "bad_token_ids", ())
    inputs = llm_request_inputs(prompt_ids, end_id, pad_id, params, streaming, bad_ids=bad_ids)
    for out in stream_model(pb_utils, model, inputs, OUTPUT_NAMES, decoupled=decoupled):
        yield generated_tokens(out["output_ids"], out["sequence_length"])


def reference_wav_arrays(wav: np.ndarray) -> dict[str, np.ndarray]:
    """One reference audio as the audio_tokenizer models take it: FP32 [1, N] and its INT32 [1, 1] length."""
    wav = np.asarray(wav, dtype=np.float32).reshape(1, -1)
    return {"reference_wav": wav, "reference_wav_len": np.array([[wav.shape[1]]], dtype=np.int32)}
