"""Request limits: body sizes enforced while the body arrives (Content-Length or not), 413 past the limit; and
how many speech requests run at once, 429 with Retry-After past it."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritontts.openai_api.errors import ApiError, overloaded


class BodySizeLimit:
    """`upload_paths`, and multipart bodies to `form_upload_paths`, get `max_upload_bytes`; every other request
    `max_request_bytes`."""

    def __init__(
        self,
        app: ASGIApp,
        max_request_bytes: int,
        max_upload_bytes: int,
        upload_paths: tuple[str, ...],
        form_upload_paths: tuple[str, ...] = (),
    ):
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_paths = upload_paths
        self.form_upload_paths = form_upload_paths

    def _is_upload(self, scope: Scope) -> bool:
        if scope["path"] in self.upload_paths:
            return True
        content_type = dict(scope.get("headers") or []).get(b"content-type", b"")
        return scope["path"] in self.form_upload_paths and content_type.startswith(b"multipart/form-data")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_upload_bytes if self._is_upload(scope) else self.max_request_bytes
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


class ConcurrencyLimit:
    """At most `max_inflight` requests to `paths` at once (0: no limit); one more is answered 429 with
    Retry-After at once. A request counts until its response has been sent or its client has gone."""

    def __init__(self, app: ASGIApp, max_inflight: int, paths: tuple[str, ...], retry_after_s: int) -> None:
        self.app = app
        self.max_inflight = max_inflight
        self.paths = paths
        self.retry_after_s = retry_after_s
        self.inflight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.max_inflight or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        if self.inflight >= self.max_inflight:
            message = f"{self.inflight} speech requests are running, the most this server takes at once; retry later"
            await overloaded(message, self.retry_after_s, status=429).response()(scope, receive, send)
            return
        self.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1
