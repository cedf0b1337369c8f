"""Sending responses: the decoupled half of a BLS (each audio chunk of one request, then the final flag or an
error), and an outbox that keeps a producer thread from ever waiting on a response sender."""

from __future__ import annotations

import logging
import queue
import threading
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

    Cancellation is asked after each chunk is sent (a round trip to the server), before the next is made: a
    chunk in hand goes out at once.
    A failure that cannot even be reported to the client is logged (the server log), never lost silently.
    """
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    sender = request.get_response_sender()
    try:
        chunks = make_chunks()
        for chunk in chunks:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor(output_name, chunk.reshape(1, -1))]))
            if request.is_cancelled():
                chunks.close()
                break
        sender.send(flags=final)
    except Exception as err:
        try:
            sender.send(error_response(pb_utils, err), flags=final)
        except Exception:
            log.exception("request %s: could not send the error %r to the client", request.request_id(), err)


class Outbox:
    """Runs `handle(event)` for one request's events in order on a thread of its own, so that the engine thread
    that produces them never waits on a response sender.

    With tritonserver 2.51, sending a response to a request whose caller (a BLS stub) was killed blocks for ever;
    sent from the LLM engine's one thread, that stalled every other request. Now only this request's thread
    stays blocked (one idle thread per killed caller)."""

    def __init__(self, handle: Callable[[Any], None], is_last: Callable[[Any], bool]) -> None:
        self.handle = handle
        self.is_last = is_last
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="response-sender", daemon=True)
        self.thread.start()

    def __call__(self, event: Any) -> None:
        self.events.put(event)

    def _run(self) -> None:
        while True:
            event = self.events.get()
            try:
                self.handle(event)
            except Exception:
                log.exception("sending a response failed")
            if self.is_last(event):
                return
