"""The Triton trace of the client request a BLS serves, handed on to the requests it makes of other models.

tritonserver traces a client request when `--trace-config` asks for it (docs/benchmarks.md); a request a BLS makes is
traced, with the client request's trace id as its `parent_id`, only when it is built with that request's trace.
`RequestRunner` marks the request each thread serves; `bls` builds every request with its trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_serving: ContextVar[Any] = ContextVar("tritontts_request_trace", default=None)


@contextmanager
def serving(request: Any) -> Iterator[None]:
    """While it runs, the requests this thread makes carry `request`'s trace."""
    trace = getattr(request, "trace", None)
    token = _serving.set(trace() if callable(trace) else None)
    try:
        yield
    finally:
        _serving.reset(token)


def traced(handle: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`handle(request)` run inside `serving(request)`."""

    def run(request: Any) -> Any:
        with serving(request):
            return handle(request)

    return run


def trace_arguments() -> dict[str, Any]:
    """The `trace` argument of `pb_utils.InferenceRequest` for the request being served (none outside one)."""
    trace = _serving.get()
    return {} if trace is None else {"trace": trace}
