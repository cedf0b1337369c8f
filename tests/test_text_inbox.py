"""Text inboxes of bistream sessions (tritontts.triton.text_inbox): ids, pushes, reading, timeouts, cleanup."""

from __future__ import annotations

import os
import threading
import time
import uuid

import pytest

from tritontts.triton import text_inbox
from tritontts.triton.params import RequestError
from tritontts.triton.text_inbox import InboxCancelled, InboxTimeout, open_inbox, push, session_name


def test_session_ids_are_uuid4s_in_either_form():
    session = uuid.uuid4()
    assert session_name(session.hex) == session_name(str(session)) == session.hex
    assert session_name(str(session).upper()) == session.hex
    for bad in ("../etc/passwd", "", "x" * 32, uuid.uuid1().hex, f"{{{session}}}", f"urn:uuid:{session}", 5):
        with pytest.raises(RequestError) as caught:
            session_name(bad)  # type: ignore[arg-type]
        assert caught.value.field == "session_id"


def test_pushed_deltas_are_read_in_order_until_final(tmp_path):
    session = uuid.uuid4().hex
    with open_inbox(session, directory=tmp_path) as inbox:
        assert (tmp_path / session).exists()
        push(session, "你好，", directory=tmp_path)
        push(session, "", directory=tmp_path)  # a keep-alive: read, no delta
        push(session, "world", final=True, directory=tmp_path)
        push(session, "after the end", directory=tmp_path)  # not read
        assert list(inbox.deltas(idle_timeout_s=1)) == ["你好，", "world"]
    assert not (tmp_path / session).exists()


def test_deltas_come_as_they_are_pushed(tmp_path):
    session = str(uuid.uuid4())
    seen: list[tuple[str, float]] = []

    def writer():
        for piece in ("a", "b", "c"):
            time.sleep(0.05)
            push(session, piece, final=piece == "c", directory=tmp_path)

    with open_inbox(session, directory=tmp_path) as inbox:
        thread = threading.Thread(target=writer)
        started = time.monotonic()
        thread.start()
        for delta in inbox.deltas(idle_timeout_s=5):
            seen.append((delta, time.monotonic() - started))
        thread.join()
    assert [d for d, _ in seen] == ["a", "b", "c"]
    assert seen[0][1] < seen[2][1] - 0.05  # the first came before the last was pushed


def test_a_push_to_an_unknown_or_ended_session_names_session_id(tmp_path):
    session = uuid.uuid4().hex
    with pytest.raises(RequestError, match="session_id: no bistream session") as caught:
        push(session, "hi", directory=tmp_path)
    assert caught.value.field == "session_id"
    open_inbox(session, directory=tmp_path).close()
    with pytest.raises(RequestError, match="session_id"):
        push(session, "hi", directory=tmp_path)
    with pytest.raises(RequestError, match="session_id"):
        push("../../x", "hi", directory=tmp_path)


def test_a_session_id_runs_once_at_a_time_and_a_push_has_a_size_limit(tmp_path):
    session = uuid.uuid4().hex
    with open_inbox(session, directory=tmp_path):
        with pytest.raises(RequestError, match="already running") as caught:
            open_inbox(session, directory=tmp_path)
        assert caught.value.field == "bistream_session"
        with pytest.raises(RequestError) as caught:
            push(session, "x" * text_inbox.MAX_PUSH_BYTES, directory=tmp_path)
        assert caught.value.field == "text"


def test_idle_timeout_and_cancel_end_the_reading(tmp_path):
    session = uuid.uuid4().hex
    with open_inbox(session, directory=tmp_path) as inbox:
        push(session, "one", directory=tmp_path)
        deltas = inbox.deltas(idle_timeout_s=0.2)
        assert next(deltas) == "one"
        started = time.monotonic()
        with pytest.raises(InboxTimeout, match="bistream_session: no text pushed for 0.2 s"):
            next(deltas)
        assert 0.2 <= time.monotonic() - started < 2
    with open_inbox(session, directory=tmp_path) as inbox:
        with pytest.raises(InboxCancelled):
            list(inbox.deltas(idle_timeout_s=10, cancelled=lambda: True))


def test_a_line_in_two_reads_waits_for_its_end(tmp_path):
    session = uuid.uuid4().hex
    with open_inbox(session, directory=tmp_path) as inbox:
        with open(tmp_path / session, "ab") as file:
            file.write(b'{"text": "ha')
            file.flush()
            assert inbox.read() == []
            file.write(b'lf", "final": true}\n')
        assert inbox.read() == ["half"] and inbox.final


def test_leftover_inboxes_are_removed_when_a_session_starts(tmp_path):
    old, other = tmp_path / uuid.uuid4().hex, tmp_path / "not-an-inbox"
    old.touch()
    other.touch()
    past = time.time() - text_inbox.STALE_S - 10
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    open_inbox(uuid.uuid4().hex, directory=tmp_path).close()
    assert not old.exists() and other.exists()


def test_the_directory_is_the_environment_s_or_per_user_under_dev_shm(monkeypatch, tmp_path):
    monkeypatch.setenv(text_inbox.DIR_ENV, str(tmp_path))
    assert text_inbox.inbox_dir() == tmp_path
    monkeypatch.delenv(text_inbox.DIR_ENV)
    assert text_inbox.inbox_dir().name == f"tritontts_text_inbox_{os.getuid()}"
