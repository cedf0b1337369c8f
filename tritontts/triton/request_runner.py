"""How a BLS model runs the requests Triton hands to `execute`.

With `concurrency` 1 (the default) `execute` runs its requests one after another and returns when they are
done, streamed ones included: tritonserver spreads concurrent requests over the model's instances, as the
upstream runtimes do. On an H100 with tritonserver 2.51, BLS stubs that ran several requests at once on worker
threads died without a message at two concurrent streams, so threads are opt-in: with `concurrency` N > 1,
`execute` hands streamed requests to N worker threads and returns at once, and runs a batch of offline requests
on them together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tritontts.triton.request_trace import traced


class RequestRunner:
    def __init__(self, concurrency: int = 1) -> None:
        if concurrency < 1:
            raise ValueError(f"max_concurrent_requests must be at least 1, got {concurrency}")
        self.pool = ThreadPoolExecutor(max_workers=concurrency) if concurrency > 1 else None

    def execute(
        self,
        requests: Sequence[Any],
        decoupled: bool,
        stream: Callable[[Any], None],
        offline: Callable[[Any], Any],
    ) -> list[Any] | None:
        """`stream(request)` sends a decoupled request's responses itself; `offline(request)` returns one. Both run
        with the request's Triton trace handed to the models they call."""
        stream, offline = traced(stream), traced(offline)
        if decoupled:
            for request in requests:
                if self.pool is None:
                    stream(request)
                else:
                    self.pool.submit(stream, request)
            return None
        if self.pool is None:
            return [offline(request) for request in requests]
        return list(self.pool.map(offline, requests))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
