"""tests/waiting.py: the bounded waits say why they gave up (no server involved: a few seconds)."""

from __future__ import annotations

import sys
import time

import pytest
from http_service import start_python
from waiting import SCALE_VARIABLE, scaled, wait_started, wait_until


def never_ready() -> tuple[bool, str]:
    return False, "503 not yet"


def test_a_process_that_exits_stops_the_wait_at_once_with_its_code_and_output(tmp_path):
    log = tmp_path / "died.log"
    code = "import sys; print('loading the models'); sys.exit(3)"
    process = start_python([sys.executable, "-c", code], log)
    began = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        wait_started(process, never_ready, "the service", log, timeout=60)
    assert time.monotonic() - began < 30
    message = str(failure.value)
    assert "exited with code 3" in message and "loading the models" in message, message
    assert "503 not yet" in message


def test_a_process_that_hangs_is_given_up_with_its_stacks(tmp_path):
    log = tmp_path / "hung.log"
    code = (
        "import time\ndef stuck_here():\n    time.sleep(600)\nprint('started', flush=False)\nstuck_here()\n"
    )
    process = start_python([sys.executable, "-c", code], log)
    with pytest.raises(AssertionError) as failure:
        wait_started(process, never_ready, "the service", log, timeout=1, stall=1)
    message = str(failure.value)
    assert process.poll() is not None
    assert "still running" in message and "503 not yet" in message, message
    # unbuffered output, and the stacks faulthandler printed on SIGABRT
    assert "started" in message and "stuck_here" in message, message


def test_a_process_still_working_gets_more_time_than_its_bound(tmp_path):
    log = tmp_path / "busy.log"
    code = "import time\nfor i in range(30):\n    print(i)\n    time.sleep(0.1)\nprint('ready')\ntime.sleep(60)\n"
    process = start_python([sys.executable, "-c", code], log)
    try:
        waited = wait_started(
            process, lambda: ("ready" in log.read_text(), "no"), "the service", log, timeout=2, stall=1
        )
    finally:
        process.kill()
        process.wait()
    assert waited > 2  # past its bound (at most 3 times it): its log kept growing


def test_wait_until_names_what_it_last_read_and_scales(monkeypatch):
    monkeypatch.setenv(SCALE_VARIABLE, "2")
    assert scaled(1.5) == 3.0
    readings = iter(range(10**6))
    with pytest.raises(AssertionError, match=r"waited 0 s for the count to reach 10\*\*9; last read: \d+"):
        wait_until(lambda: next(readings), lambda n: n >= 10**9, "the count to reach 10**9", timeout=0.1)
    assert wait_until(lambda: next(readings), lambda n: n % 7 == 0, "a multiple of 7") % 7 == 0
