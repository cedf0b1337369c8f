"""The watchdog (tritontts.triton.watchdog) beside a server whose model loads: while a python model loads,
tritonserver 2.51 runs a stub for the model itself, named after it, for its auto_complete_config, and that stub
exits by design once the model's instances start. The watchdog must not take it for a dead stub and load the
model a second time (loaded again through model control: scripts/triton_server.py reload, an operator); and a
server that dies while the model loads leaves that stub's pool in /dev/shm for the watchdog's last sweep."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from conftest import echo_shaped_model, start_explicit_server
from reliability_models import WatchdogProcess
from waiting import scaled, wait_until

from tritontts.triton.reload import reload_with_parameters
from tritontts.triton.stubs import is_alive, list_stubs

MODEL = "watchdog_slow_autocomplete"
AUTOCOMPLETE_S = 3.0
"""long enough for several of the watchdog's polls (every 0.5 s here) to see the model's own stub"""


def _model_py(autocomplete_s: float) -> str:
    return f"""
import time


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        time.sleep({autocomplete_s})
        return config

    def execute(self, requests):
        raise NotImplementedError("this test only loads the model")
"""


def _stub_names_while(action, server_pid: int) -> set[str]:
    """The stubs' names (instance, or the model's own) seen under the server while `action()` runs."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(s.instance for s in list_stubs(server_pid))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        action()
    finally:
        done.set()
        watcher.join()
    return seen


def test_a_model_loaded_again_is_not_taken_for_dead_for_its_own_autocomplete_stub(tmp_path):
    repo = tmp_path / "model_repo"
    echo_shaped_model(repo, MODEL, _model_py(AUTOCOMPLETE_S))
    server = start_explicit_server(repo, tmp_path / "tritonserver.log")
    watchdog = None
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=300.0)
        client.load_model(MODEL)
        client.close()
        watchdog = WatchdogProcess(server, tmp_path / "events.jsonl")
        parameters: dict[str, str] = {}
        seen = _stub_names_while(
            lambda: parameters.update(reload_with_parameters(repo, MODEL, {"scale": "3.0"}, server.http_url)),
            server.pid,
        )
        assert parameters["scale"] == "3.0"
        assert MODEL in seen and f"{MODEL}_0_0" in seen, f"stubs seen while loading: {sorted(seen)}"
        # the watchdog acts at the latest grace (1 s) + a poll (0.5 s) after a stub is gone: give it 5 s
        deadline = time.monotonic() + scaled(5.0)
        while time.monotonic() < deadline and "died" not in watchdog.log_path.read_text():
            time.sleep(0.2)
        assert "died" not in watchdog.log_path.read_text(), watchdog.log_path.read_text()[-2000:]
        assert watchdog.actions() == []
        assert server.config.log_file.read_text().count(f'"loading: {MODEL}:1"') == 2
    finally:
        if watchdog is not None:
            watchdog.stop()
        server.stop(grace_s=10)


def test_a_server_killed_while_a_model_loads_leaves_no_pool_once_the_watchdog_ends(tmp_path):
    repo = tmp_path / "model_repo"
    echo_shaped_model(repo, MODEL, _model_py(600))
    server = start_explicit_server(repo, tmp_path / "tritonserver.log")
    watchdog = None
    try:
        watchdog = WatchdogProcess(server, tmp_path / "events.jsonl")
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600.0)
        threading.Thread(target=_load_until_the_server_dies, args=(client,), daemon=True).start()
        (stub, *_) = wait_until(
            lambda: [s for s in list_stubs(server.pid) if not s.runs_an_instance],
            bool,
            f"a load-time stub of {MODEL}",
            timeout=60.0,
            interval=0.1,
        )
        time.sleep(1.0)  # two of the watchdog's polls (every 0.5 s here)
        pool = Path("/dev/shm") / stub.shm_region
        assert pool.exists()
        os.kill(server.pid, signal.SIGKILL)
        try:
            watchdog.process.wait(timeout=scaled(90.0))  # its last sweep waits for the stub to be gone
        except subprocess.TimeoutExpired:
            pytest.fail("the watchdog outlived the server")
        log = watchdog.log_path.read_text()
        assert f"model '{MODEL}' is loading (its load-time stub: pid {stub.pid})" in log, log[-2000:]
        assert not pool.exists(), log[-2000:]
        assert not is_alive(stub.pid), "the load-time stub outlived the watchdog"
    finally:
        if watchdog is not None:
            watchdog.stop()
        server.stop(grace_s=10)


def _load_until_the_server_dies(client: httpclient.InferenceServerClient) -> None:
    try:
        client.load_model(MODEL)
    except Exception:  # the server is killed under the load: what the test does
        pass
