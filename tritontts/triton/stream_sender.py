"""The decoupled half of a BLS: send each audio chunk of one request, then the final flag (or an error)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tritontts.triton.params import error_response

log = logging.getLogger(__name__)


def serve_stream(
    pb_utils: Any,
    request: Any,
    make_chunks: Callable[[], Iterator[np.ndarray]],
    output_name: str = "waveform",
) -> None:
    """Runs on a worker thread: a chunk per response until the generator ends or the client cancels.

    A failure that cannot even be reported to the client is logged (the server log), never lost silently.
    """
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    sender = request.get_response_sender()
    try:
        chunks = make_chunks()
        for chunk in chunks:
            if request.is_cancelled():
                chunks.close()
                break
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(output_name, chunk.reshape(1, -1))]))
        sender.send(flags=final)
    except Exception as err:
        try:
            sender.send(error_response(pb_utils, err), flags=final)
        except Exception:
            log.exception("request %s: could not send the error %r to the client", request.request_id(), err)
