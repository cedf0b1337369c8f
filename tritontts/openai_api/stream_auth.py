"""The API key of a speech stream: the `Authorization: Bearer` header of the upgrade request, or `session.config`'s
`api_key`, what a browser's WebSocket can send (it sets no headers). A query parameter is not read: uvicorn's
access log, and proxies', write URLs out whole."""

from __future__ import annotations

import hmac

from fastapi import WebSocket

from tritontts.openai_api.errors import ApiError

KEY_HELP = (
    "Incorrect or missing API key: send 'Authorization: Bearer <key>' on the upgrade request, or api_key in "
    "session.config (a query parameter is not read: URLs end up in logs)"
)


def offered_key(websocket: WebSocket) -> str | None:
    """The upgrade request's key ("" for an Authorization header that is not Bearer); None without the header."""
    header = websocket.headers.get("authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def key_matches(expected: str, key: object) -> bool:
    return isinstance(key, str) and hmac.compare_digest(key.encode(), expected.encode())


def refusal() -> ApiError:
    return ApiError(401, KEY_HELP, code="invalid_api_key")
