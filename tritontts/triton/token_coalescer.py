"""Tokens of several decode steps in one streamed response while many requests decode.

Every streamed response costs the LLM model's process a few hundred microseconds of Python and IPC under the
GIL, which the engine's thread shares: at 64 streams, one response per token and stream made each engine step
wait for 64 sends. A coalescer forwards a request's tokens once `interval()` of them are pending (or the request
ends), so the sends per step stay near a fixed number whatever the batch. With one or a few requests running the
interval is 1 and every token is sent as soon as it is sampled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from tritontts.llm.sequence import TokenEvent

AUTO = "auto"
STREAMS_PER_SEND = 16
"""`auto`: one token per response up to this many running requests, then one more token per this many more."""
MAX_AUTO_INTERVAL = 8


def parse_stream_interval(value: str) -> int | None:
    """The `stream_interval` model parameter: `auto` (None) or tokens per response, a positive integer."""
    if value == AUTO:
        return None
    try:
        interval = int(value)
    except ValueError:
        interval = 0
    if interval < 1:
        raise ValueError(f"stream_interval must be 'auto' or a positive integer, got {value!r}")
    return interval


def auto_interval(running: int) -> int:
    """Tokens per response for `running` requests decoding together."""
    return min(MAX_AUTO_INTERVAL, max(1, -(-running // STREAMS_PER_SEND)))


@dataclass
class TokenCoalescer:
    """Called with each TokenEvent of one request on the engine's thread; forwards the pending tokens in one
    event when `interval()` of them are pending, and always the last event (with every token not yet sent)."""

    forward: Callable[[TokenEvent], None]
    interval: Callable[[], int]
    pending: list[int] = field(default_factory=list)

    def __call__(self, event: TokenEvent) -> None:
        self.pending += event.token_ids
        if event.finished or len(self.pending) >= self.interval():
            tokens, self.pending = self.pending, []
            self.forward(dataclasses.replace(event, token_ids=tokens))
