"""One engine request as an async stream of new token ids; extra stop ids cancel it, as does `close()`.

The engine stops on one `end_id`; any further stop id is caught here on the engine's thread: the tokens from it
on are dropped and the request is cancelled, finishing with "stop".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import FinishReason, SamplingParams, TokenEvent

FINISH_REASONS = {
    FinishReason.END_ID: "stop",
    FinishReason.MAX_TOKENS: "length",
    FinishReason.CANCELLED: "abort",
}


class GenerationError(RuntimeError):
    pass


@dataclass(frozen=True)
class Chunk:
    token_ids: list[int]
    finish_reason: str | None = None
    error: str | None = None


class EngineStream:
    def __init__(
        self,
        engine: LLMEngine,
        request_id: int,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        extra_stop_ids: frozenset[int] = frozenset(),
    ) -> None:
        """Queues the request; ValueError when the engine refuses the prompt."""
        self.engine = engine
        self.request_id = request_id
        self.min_tokens = params.min_tokens
        self.extra_stop_ids = extra_stop_ids
        self.generated = 0
        self.finished = False
        self._stopped = False
        self._loop = asyncio.get_running_loop()
        self._chunks: asyncio.Queue[Chunk] = asyncio.Queue()
        engine.add_request(prompt_ids, params, self._on_tokens, request_id)

    def _on_tokens(self, event: TokenEvent) -> None:
        if self._stopped:
            return
        tokens, finish = event.token_ids, FINISH_REASONS.get(event.finish_reason)
        for i, token in enumerate(tokens):
            if token in self.extra_stop_ids and self.generated + i >= self.min_tokens:
                tokens, finish, self._stopped = tokens[:i], "stop", True
                self.engine.cancel(self.request_id)
                break
        self.generated += len(tokens)
        error = event.error or ("generation failed" if event.finish_reason == FinishReason.ERROR else None)
        self._loop.call_soon_threadsafe(self._chunks.put_nowait, Chunk(tokens, finish, error))

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Chunks until the one with a finish_reason; raises GenerationError when the engine failed."""
        while not self.finished:
            chunk = await self._chunks.get()
            if chunk.error is not None:
                self.finished = True
                raise GenerationError(chunk.error)
            self.finished = chunk.finish_reason is not None
            yield chunk

    def close(self) -> None:
        """Cancel the request unless it finished (a client that went away)."""
        if not self.finished:
            self.finished = True
            self.engine.cancel(self.request_id)
