"""The session server's care of itself (tests/conftest.py): a server that died starts again on its ports with its
models, and a session-server test runs once more only when tritonserver 2.51 crashed under it in its python
backend or failed a request of a stub it took for dead while the stub ran on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    TRITON_MODELS_DIR,
    RunningTriton,
    ServerDied,
    StubTakenForDead,
    StuckLoad,
    StuckUnload,
    _session_server_hit_a_python_backend_fault,
    echo,
    echo_shaped_model,
    python_backend_crash,
    start_explicit_server,
)
from tritonclient.utils import InferenceServerException
from waiting import scaled

from tritontts.triton.stubs import current_stubs

TRITON_MODELS = [TRITON_MODELS_DIR / "infra_echo"]

# The end of the log of a session server that died this way on CI's 2-core machine (python backend r24.10), the
# response of a request its backend had failed a moment before ("Stub process '...' is not healthy").
RESPONSE_SEND_CRASH = """I1206 09:18:18.403280 8052 model_lifecycle.cc:839] "successfully loaded 'm'"
Signal (11) received.
 0# 0x0000560A927DE52D in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007F712C65A050 in /lib/x86_64-linux-gnu/libc.so.6
 2# pthread_mutex_lock in /lib/x86_64-linux-gnu/libc.so.6
 3# 0x0000560A928423E5 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 4# 0x00007F712D048390 in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 5# TRITONBACKEND_ResponseSend in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 6# 0x00007F71247668B4 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
"""


# The end of the log of a session server that died under test_reliability_memory's traffic on the 2-core machine
# (python backend r24.10): two threads at once, inside the python backend's execute, with no error logged before.
EXECUTE_CRASH = """I1206 19:42:16.979603 20441 model_lifecycle.cc:839] "successfully loaded 'cosyvoice2_dit_offline'"
Signal (11) received.
Signal (11) received.
 0# 0x000055BE52ABC52D in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007F972825A050 in /lib/x86_64-linux-gnu/libc.so.6
 2# 0x00007F9720378E7A in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
 3# 0x00007F9720367F0C in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
 4# 0x00007F9720326D57 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
 5# TRITONBACKEND_ModelInstanceExecute in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
 6# 0x00007F9728BA70B4 in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
"""


# The same late response ending in an abort: the lock it takes lies in memory already freed and reused.
RESPONSE_SEND_ABORT = """I1206 19:58:37.679431 2329 model_lifecycle.cc:839] "successfully loaded 'cosyvoice2_dit_offline'"
tritonserver: pthread_mutex_lock.c:450: __pthread_mutex_lock_full: Assertion `e != ESRCH || !robust' failed.
Signal (6) received.
 0# 0x0000563151A4952D in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007FCBE985A050 in /lib/x86_64-linux-gnu/libc.so.6
 2# 0x00007FCBE98A8EEC in /lib/x86_64-linux-gnu/libc.so.6
 3# gsignal in /lib/x86_64-linux-gnu/libc.so.6
 4# abort in /lib/x86_64-linux-gnu/libc.so.6
 5# 0x00007FCBE9844395 in /lib/x86_64-linux-gnu/libc.so.6
 6# 0x00007FCBE9852EC2 in /lib/x86_64-linux-gnu/libc.so.6
 7# 0x00007FCBE98AA361 in /lib/x86_64-linux-gnu/libc.so.6
 8# 0x0000563151ABA7E0 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 9# 0x00007FCBEA248390 in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
10# TRITONBACKEND_ResponseSend in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
11# 0x00007FCBE01638B4 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
"""


# A session server that aborted while loading a model on the 2-core machine (python backend r24.10): a stub had died
# holding its pool's lock, and the instance's finalize threw on it.
LOAD_LOCK_ABORT = """I1206 23:48:02.317097 13942 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: m_0_0 (CPU device 0)"
terminate called after throwing an instance of 'boost::interprocess::lock_exception'
  what():  boost::interprocess::lock_exception
Signal (6) received.
 0# 0x000055BE6FD6B52D in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007F612A25A050 in /lib/x86_64-linux-gnu/libc.so.6
"""


# A token2wav tritonserver of the disaggregated test on the 2-core machine (python backend r24.10): a segmentation
# fault inside the server while the BLS submitted a request to another model.
INFER_ASYNC_CRASH = """I1207 00:18:57.915880 18254 http_server.cc:362] "Started Metrics Service at 127.0.0.1:38288"
Signal (11) received.
 0# 0x0000558149E5F52D in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 1# 0x00007F4F8AE5A050 in /lib/x86_64-linux-gnu/libc.so.6
 2# pthread_mutex_lock in /lib/x86_64-linux-gnu/libc.so.6
 3# 0x0000558149FF18EF in /venv/lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver
 4# 0x00007F4F8B91D185 in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 5# TRITONSERVER_ServerInferAsync in /venv/lib/python3.11/site-packages/nvidia_pytriton.libs/libtritonserver-717102f0.so
 6# 0x00007F4F85E1FC09 in /venv/lib/python3.11/site-packages/pytriton/tritonserver/backends/python/libtriton_python.so
"""


def test_the_crash_signatures_are_python_backend_faults():
    assert python_backend_crash(RESPONSE_SEND_CRASH)
    assert python_backend_crash(RESPONSE_SEND_ABORT)
    assert python_backend_crash(EXECUTE_CRASH)
    assert python_backend_crash(LOAD_LOCK_ABORT)
    assert python_backend_crash(INFER_ASYNC_CRASH)
    assert not python_backend_crash(LOAD_LOCK_ABORT.replace("lock_exception", "bad_alloc"))
    assert not python_backend_crash(
        INFER_ASYNC_CRASH.replace("python/libtriton_python", "onnx/libtriton_onnx")
    )
    another_backend = EXECUTE_CRASH.replace(
        "backends/python/libtriton_python.so", "backends/onnx/libtriton_onnx.so"
    )
    assert not python_backend_crash(another_backend)
    assert not python_backend_crash(EXECUTE_CRASH.replace("Signal (11)", "Signal (6)"))
    for crash in (RESPONSE_SEND_CRASH, RESPONSE_SEND_ABORT):
        assert not python_backend_crash(
            crash.replace("TRITONBACKEND_ResponseSend", "TRITONBACKEND_ModelFinalize")
        )


def echo_server(tmp_path: Path) -> RunningTriton:
    """A server of its own over infra_echo (not loaded yet)."""
    repo = tmp_path / "model_repo"
    repo.mkdir()
    (repo / "infra_echo").symlink_to(TRITON_MODELS_DIR / "infra_echo", target_is_directory=True)
    return RunningTriton(server=start_explicit_server(repo, tmp_path / "tritonserver.log"), repo=repo)


def test_a_dead_server_starts_again_on_its_ports_with_its_models(tmp_path):
    running = echo_server(tmp_path)
    try:
        running.load("infra_echo")
        urls = (running.http_url, running.grpc_url)
        (pool,) = running.pools
        assert not running.restart_if_dead()
        lost = InferenceServerException("[StatusCode.UNAVAILABLE] Stream removed (Socket closed)")
        assert not running.exited_after(lost, timeout_s=1) and "tritonserver runs" in running.state()
        os.kill(running.server.pid, signal.SIGSEGV)
        assert running.exited_after(lost)  # waits for the crash handler to end the process
        assert "exited with code" in running.state() and "Signal (11)" in running.state()
        assert not running.died_of_a_python_backend_crash()  # a segfault, but not in the python backend
        with pytest.warns(ServerDied, match=r"(?s)exited with code -11.*Signal \(11\) received"):
            assert running.restart_if_dead()
        assert (running.http_url, running.grpc_url) == urls and running.loaded == {"infra_echo"}
        np.testing.assert_array_equal(echo(running.http_url), 2 * np.arange(3, dtype=np.float32))
        assert "Signal (11) received" in running.restarts[0].read_text(errors="replace")
        assert not (Path("/dev/shm") / pool).exists() and running.pools and pool not in running.pools
    finally:
        running.server.stop(grace_s=15)


def test_session_server_tests_rerun_only_on_the_crash_or_a_live_stub_taken_for_dead(request, triton):
    marker = request.node.get_closest_marker("flaky")
    assert marker is not None and marker.kwargs["reruns"] == 1, marker
    assert marker.kwargs["condition"] is _session_server_hit_a_python_backend_fault
    assert request.node.get_closest_marker("triton") is not None
    triton.load("infra_echo")
    gone = InferenceServerException("[StatusCode.INTERNAL] Stub process 'no_such_model_0_0' is not healthy.")
    assert not _session_server_hit_a_python_backend_fault(gone)  # a stub that died: a real failure
    assert not _session_server_hit_a_python_backend_fault(AssertionError("audio differs"))
    assert not _session_server_hit_a_python_backend_fault(None)


def test_a_live_stub_taken_for_dead_starts_the_server_again_before_the_rerun(tmp_path):
    """The backend failed a request of a stub that still runs: its late answer would crash tritonserver 2.51 under
    the rerun (CI: a segmentation fault in TRITONBACKEND_ResponseSend a second after), so the server starts again
    first, on the same ports and with its models; a stub that is gone is a real failure and changes nothing."""
    running = echo_server(tmp_path)
    try:
        running.load("infra_echo")
        pid, urls = running.server.pid, (running.http_url, running.grpc_url)
        gone = InferenceServerException("[StatusCode.INTERNAL] Stub process 'no_such_0_0' is not healthy.")
        assert not running.restart_after_a_stub_taken_for_dead(gone) and running.server.pid == pid
        live = current_stubs(pid)["infra_echo_0_0"].instance
        taken_for_dead = InferenceServerException(
            f"[StatusCode.INTERNAL] Stub process '{live}' is not healthy."
        )
        with pytest.warns(StubTakenForDead, match="is not healthy.*starts again"):
            assert running.restart_after_a_stub_taken_for_dead(taken_for_dead)
        assert running.server.pid != pid and (running.http_url, running.grpc_url) == urls
        assert running.loaded == {"infra_echo"} and len(running.restarts) == 1
        np.testing.assert_array_equal(echo(running.http_url), 2 * np.arange(3, dtype=np.float32))
    finally:
        running.server.stop(grace_s=15)


def server_with_echo_and(tmp_path: Path, name: str, model_py: str) -> RunningTriton:
    """A server of its own over infra_echo and a model `name` of infra_echo's shape running `model_py`."""
    repo = tmp_path / "model_repo"
    repo.mkdir()
    (repo / "infra_echo").symlink_to(TRITON_MODELS_DIR / "infra_echo", target_is_directory=True)
    echo_shaped_model(repo, name, model_py)
    return RunningTriton(server=start_explicit_server(repo, tmp_path / "tritonserver.log"), repo=repo)


SLOW_FINALIZE = """import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]

    def finalize(self):
        time.sleep(120)
"""


def test_a_model_that_does_not_unload_in_time_is_reported_and_the_server_starts_again(tmp_path):
    running = server_with_echo_and(tmp_path, "slow", SLOW_FINALIZE)
    try:
        running.load("infra_echo", "slow")
        pid = running.server.pid
        with pytest.warns(StuckUnload, match="slow"):
            running.unload("slow", timeout=3)
        assert running.server.pid != pid and running.loaded == {"infra_echo"} and len(running.restarts) == 1
        np.testing.assert_array_equal(echo(running.http_url), 2 * np.arange(3, dtype=np.float32))
    finally:
        running.server.stop(grace_s=15)


HANGS_ONCE = """from pathlib import Path

import triton_python_backend_utils as pb_utils

from tritontts.triton.debug import enable_stack_dumps

MARKER = Path(__file__).parent / "hung_once"


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        if not MARKER.exists():
            MARKER.touch()
            wait_for_ever()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]


def wait_for_ever():
    import threading

    threading.Event().wait()
"""


def test_a_load_that_hangs_is_reported_with_its_stack_and_tried_once_more_on_a_fresh_server(tmp_path):
    running = server_with_echo_and(tmp_path, "hangs_once", HANGS_ONCE)
    try:
        running.load("infra_echo")
        pid = running.server.pid
        with pytest.warns(StuckLoad, match=r"(?s)loading hangs_once took over \d+ s.*wait_for_ever"):
            running.load(
                "hangs_once", timeout=scaled(15)
            )  # a fresh stub's load on a busy 2-core machine: 5 s failed once
        assert running.server.pid != pid and running.loaded == {"infra_echo", "hangs_once"}
        assert len(running.restarts) == 1
        np.testing.assert_array_equal(echo(running.http_url), 2 * np.arange(3, dtype=np.float32))
    finally:
        running.server.stop(grace_s=15)
