"""Request body limits enforced while the body arrives (Content-Length or not): 413 past the limit."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritontts.openai_api.errors import ApiError


class BodySizeLimit:
    """`upload_paths` get `max_upload_bytes`, every other request `max_request_bytes`."""

    def __init__(
        self, app: ASGIApp, max_request_bytes: int, max_upload_bytes: int, upload_paths: tuple[str, ...]
    ):
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_paths = upload_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_upload_bytes if scope["path"] in self.upload_paths else self.max_request_bytes
        message = f"the request body is larger than {limit} bytes"
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await ApiError(413, message, code="request_too_large").response()(scope, receive, send)
            return
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            event = await receive()
            if event["type"] == "http.request":
                received += len(event.get("body", b""))
                if received > limit:
                    raise HTTPException(413, message)
            return event

        await self.app(scope, counting_receive, send)
