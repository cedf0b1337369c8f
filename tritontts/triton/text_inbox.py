"""Text inboxes: text deltas for a running bistream request (docs/streaming-text.md, "Bistream").

Triton gives a running decoupled request no way to take more input, and a follow-up request may land on another
BLS instance (another process), so the text of a bistream session travels through a file of the server host's
shared memory filesystem: the BLS creates `<dir>/<session>` when the request starts and removes it when the
request ends (done, failed or cancelled); the `text_inbox` model appends one JSON line per push to it
(`{"text": ..., "final": ...}`, a single O_APPEND write, so concurrent pushes never interleave), and the BLS reads
the lines as they come until one is final.

The directory is `$TRITONTTS_TEXT_INBOX_DIR`, else `/dev/shm/tritontts_text_inbox_<uid>` (the temporary directory
where there is no /dev/shm). Session ids are uuid4s (32 hex digits, or the hyphenated form), so no id names
another path.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tritontts.triton.params import RequestError, error_response, optional_input, string_input

DIR_ENV = "TRITONTTS_TEXT_INBOX_DIR"
SESSION_FIELD = "session_id"
MAX_PUSH_BYTES = 64 << 10
"""the longest line one push writes (larger writes might not be one atomic append)"""
POLL_S, MAX_POLL_S = 0.002, 0.01
"""the reader's sleep while waiting for text: 2 ms, doubling up to 10 ms while nothing comes"""
CANCEL_CHECK_S = 0.1
STALE_S = 3600.0
"""an inbox untouched this long is a leftover (a killed BLS process) and is removed when a session starts"""
_SESSION = re.compile(r"[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class InboxTimeout(RequestError):
    """No text came for the session's idle timeout (a request error naming `bistream_session`)."""

    def __init__(self, idle_timeout_s: float) -> None:
        super().__init__(
            "bistream_session",
            f"no text pushed for {idle_timeout_s:g} s (the idle timeout): the session ended",
        )


class InboxCancelled(RuntimeError):
    """The request reading the inbox was cancelled."""


def inbox_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    base = Path("/dev/shm")
    if not base.is_dir():
        base = Path(tempfile.gettempdir())
    return base / f"tritontts_text_inbox_{os.getuid()}"


def session_name(session: str, field: str = SESSION_FIELD) -> str:
    """A session id as its file name (32 lowercase hex digits); RequestError naming `field` unless a uuid4."""
    text = session.strip().lower() if isinstance(session, str) else ""
    if not _SESSION.fullmatch(text) or uuid.UUID(text).version != 4:
        raise RequestError(
            field, f"must be a uuid4 (32 hex digits or the hyphenated form), got {session!r:.80}"
        )
    return uuid.UUID(text).hex


def push(session: str, text: str, final: bool = False, directory: Path | None = None) -> None:
    """Append `text` (and `final`) to a running session's inbox; RequestError naming `session_id` when there is
    no such session (not started yet, or ended), naming `text` when the push is too long."""
    path = (directory or inbox_dir()) / session_name(session)
    line = (json.dumps({"text": text, "final": bool(final)}, ensure_ascii=False) + "\n").encode()
    if len(line) > MAX_PUSH_BYTES:
        raise RequestError("text", f"is {len(line)} bytes as pushed; at most {MAX_PUSH_BYTES} per push")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except FileNotFoundError:
        raise RequestError(
            SESSION_FIELD, f"no bistream session {session!r} on this server (not started yet, or ended)"
        ) from None
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class Inbox:
    """One session's inbox, created by `open_inbox` and removed by `close`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self.final = False

    def close(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def __enter__(self) -> Inbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def read(self) -> list[str]:
        """The text of the complete lines pushed since the last read (empty strings dropped); sets `final`."""
        with open(self.path, "rb") as file:
            file.seek(self._offset)
            data = file.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        texts = []
        for line in lines:
            if self.final:
                break  # text after the final push is not read
            entry = json.loads(line)
            if entry.get("text"):
                texts.append(str(entry["text"]))
            self.final = bool(entry.get("final"))
        return texts

    def deltas(self, idle_timeout_s: float, cancelled: Callable[[], bool] | None = None) -> Iterator[str]:
        """Text deltas as they are pushed, until the final push; InboxTimeout when nothing (not even an empty
        push) comes for `idle_timeout_s`, InboxCancelled once `cancelled()` (checked every 100 ms) is true."""
        last = checked = time.monotonic()
        sleep = POLL_S
        while not self.final:
            size = self._offset
            texts = self.read()
            now = time.monotonic()
            if self._offset != size:
                last, sleep = now, POLL_S
                yield from texts
                continue
            if now - last > idle_timeout_s:
                raise InboxTimeout(idle_timeout_s)
            if cancelled is not None and now - checked >= CANCEL_CHECK_S:
                checked = now
                if cancelled():
                    raise InboxCancelled("the request was cancelled")
            time.sleep(sleep)
            sleep = min(sleep * 2, MAX_POLL_S)


def open_inbox(session: str, field: str = "bistream_session", directory: Path | None = None) -> Inbox:
    """Create the inbox of a new session; RequestError naming `field` for a bad or already used id."""
    root = directory or inbox_dir()
    name = session_name(session, field)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    _remove_stale(root)
    path = root / name
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        raise RequestError(field, f"session {session!r} is already running") from None
    return Inbox(path)


def _remove_stale(root: Path) -> None:
    cutoff = time.time() - STALE_S
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            if _SESSION.fullmatch(entry.name) and entry.stat().st_mtime < cutoff:
                os.unlink(entry.path)
        except OSError:
            pass


class TextInboxModel:
    """The `text_inbox` Triton model: each request (`session_id`, `text`, optional `final`) is one push, answered
    with `accepted: [true]` or an error naming the input at fault (an unknown session names `session_id`)."""

    def __init__(self, pb_utils: Any) -> None:
        self.pb = pb_utils

    def execute(self, requests: list[Any]) -> list[Any]:
        return [self._one(request) for request in requests]

    def _one(self, request: Any) -> Any:
        try:
            session = string_input(self.pb, request, SESSION_FIELD)
            text = string_input(self.pb, request, "text", default="")
            final = optional_input(self.pb, request, "final", dtype=np.bool_)
            if final is not None and final.size != 1:
                raise RequestError("final", f"must hold one value, got {final.size}")
            push(session, text, final is not None and bool(final.reshape(-1)[0]))
            return self.pb.InferenceResponse([self.pb.Tensor("accepted", np.array([True]))])
        except Exception as err:
            return error_response(self.pb, err)
