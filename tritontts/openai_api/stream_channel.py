"""A speech stream's socket as its two tasks share it: one message at a time, nothing after the close, and the
errors that only say the client has gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import WebSocket, WebSocketDisconnect
from starlette.websockets import WebSocketDisconnected

from tritontts.openai_api.errors import ApiError, bad_request

NORMAL, POLICY, SERVER_FAILURE = 1000, 1008, 1011
"""close codes: after session.close or the idle timeout; a refused key or no config in time; an internal error"""


def problem(message: str, code: str, param: str | None = None) -> ApiError:
    return bad_request(message, param, code)


def gone(error: BaseException) -> bool:
    """Whether `error` only says that the client has gone."""
    return isinstance(error, (WebSocketDisconnect, WebSocketDisconnected, OSError))


async def quietly(sending: Awaitable[None]) -> None:
    """`sending`, whether or not the client is still there."""
    try:
        await sending
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass


class Channel:
    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self.closed = False
        self._lock = asyncio.Lock()

    async def json(self, payload: dict) -> None:
        async with self._lock:
            if not self.closed:
                await self.websocket.send_json(payload)

    async def audio(self, data: bytes) -> None:
        async with self._lock:
            if not self.closed and data:
                await self.websocket.send_bytes(data)

    async def error(self, err: ApiError, **where: int) -> None:
        await self.json(
            {"type": "error", "message": err.message, "param": err.param, "code": err.code, **where}
        )

    async def close(self, code: int, reason: str = "") -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            await quietly(self.websocket.close(code, reason))  # the client may have gone first
