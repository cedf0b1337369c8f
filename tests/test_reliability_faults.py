"""Scenario 1 of the reliability suite: a stub killed mid-stream.

What must hold: SIGKILL to a BLS stub, to the `tensorrt_llm` (torch engine) stub, to the vocoder stub
(Spark-TTS) and to the token2wav stub (CosyVoice2), each while 4 streams run: every stream ends (audio or an
error), none hangs; the watchdog (tritontts.triton.watchdog) reloads the model whose stub died, after which
the next requests succeed (CI: 6, three rounds over the BLS's 2 instances; scripts/soak.py: 20). Where the
model cannot be reloaded (no explicit model control), the watchdog stops the server: its readiness turns
false.

tritonserver 2.51 alone never restarts a killed stub: requests routed to its instance fail with "Stub process
... is not healthy" for ever while the model and the server stay ready, and a BLS that waits for a decoupled
model's responses when that model's stub dies waits for ever (fixed in tritontts.triton.bls).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import tritonclient.http as httpclient
from conftest import PROMPT_ZH, TRITON_MODELS_DIR, build_repository, start_explicit_server
from cosyvoice2_models import build_cosyvoice2_models
from leftover_stubs import kill_leftover_stubs
from reliability_models import (
    COSY_MODELS,
    COSY_STREAM,
    COSY_TOKEN2WAV,
    LLM_STREAM,
    SPARK_MODELS,
    SPARK_STREAM,
    TOKENIZER,
    VOCODER,
    WatchdogProcess,
    build_reliability_cosyvoice2_models,
    build_reliability_models,
    json_lines,
    knob,
    read_outcome,
    record,
    reference_clip,
    reference_fixture,
    spark_arrays,
)
from triton_stream import Stream
from waiting import scaled, wait_until

from tritontts.triton.server import ServerConfig, TritonServer, free_ports, is_ready, is_tritonserver
from tritontts.triton.stubs import current_stubs, free_shm_region, list_stubs, mapped_by

MODEL_BUILDERS = [build_reliability_models, build_cosyvoice2_models, build_reliability_cosyvoice2_models]
pytestmark = pytest.mark.reliability
LOCK_ABORT = "boost::interprocess::lock_exception"
SILENCE_S = 180  # a stream that sends nothing for this long counts as hung (a shared, loaded CI machine)
NEXT_REQUESTS = int(knob("next_requests", 6))  # scripts/soak.py: 20


def aborted_on_a_lock(server: TritonServer) -> bool:
    """tritonserver 2.51 exited with `LOCK_ABORT` in its log (FaultServer's docstring)."""
    return server.process.poll() is not None and LOCK_ABORT in server.config.log_file.read_text(
        errors="replace"
    )


class FaultServer:
    """This module's own tritonserver with the Spark-TTS and CosyVoice2 reliability models, warmed up, and a
    watchdog beside it. A stub killed while it holds its pool's lock can abort tritonserver 2.51 itself (SIGABRT,
    `boost::interprocess::lock_exception`; docs/reliability.md): that must not take the session's server, which
    every later module uses, with it; `restart_if_aborted` starts a fresh one after it."""

    def __init__(self, root: Path) -> None:
        self.root, self.repo, self.starts = root, root / "model_repo", 0
        build_repository(MODEL_BUILDERS, self.repo, root / "data")
        self.server, self.watchdog = self._start()

    def _start(self) -> tuple[TritonServer, WatchdogProcess]:
        self.starts += 1
        server = start_explicit_server(self.repo, self.root / f"tritonserver_{self.starts}.log")
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600.0)
        for model in (*SPARK_MODELS, *COSY_MODELS):
            client.load_model(model)
        client.close()
        arrays = spark_arrays(reference_clip(PROMPT_ZH))
        for entry in (SPARK_STREAM, COSY_STREAM):  # first requests warm every model up
            assert read_outcome(Stream(server.grpc_url, entry, arrays, ["waveform"]), 600)[0] == "ok"
        return server, WatchdogProcess(server, self.root / f"events_{self.starts}.jsonl")

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    def aborted_on_a_lock(self) -> bool:
        return aborted_on_a_lock(self.server)

    def restart_if_aborted(self) -> None:
        """A fresh server where an earlier case's kill aborted this one."""
        if self.server.process.poll() is not None:
            self.stop()
            self.server, self.watchdog = self._start()

    def stop(self) -> None:
        # the old instances 2.51 kept hold their stubs and pools until the server exits, and leaves the pools
        # then: the watchdog, which outlives it, removes them (and so does this module at exit)
        _KEPT_REGIONS.extend(s.shm_region for s in list_stubs(self.server.pid))
        self.server.stop(grace_s=15)
        try:
            self.watchdog.process.wait(timeout=30)  # its last sweep once the server is gone
        except subprocess.TimeoutExpired:
            self.watchdog.stop()
        kill_leftover_stubs(self.repo)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    fault_server = FaultServer(tmp_path_factory.mktemp("fault_server"))
    yield fault_server
    fault_server.stop()


@contextmanager
def a_lock_abort_fails_expectedly(server: FaultServer, victim: str):
    """A failure after tritonserver aborted on a dead stub's pool lock (the 2.51 bug of FaultServer's docstring)
    is recorded and marked xfail; any other failure stays a failure."""
    try:
        yield
    except Exception:
        if not server.aborted_on_a_lock():
            raise
        record("stub_killed", model=victim, server_aborted=LOCK_ABORT)
        pytest.xfail(
            f"tritonserver 2.51 aborted ({LOCK_ABORT}): {victim}'s stub died holding its pool's lock"
        )


reference = reference_fixture()


def kill_stub(server, model: str):
    """SIGKILL to a stub serving `model` now (not an old version's stub that 2.51 kept after a reload)."""
    stubs = [s for s in current_stubs(server.pid).values() if s.model == model]
    assert stubs, f"no stub of {model}"
    os.kill(stubs[0].pid, signal.SIGKILL)
    return stubs[0]


def wait_unmapped(region: Path, holder: int, timeout: float = 30.0) -> list[int]:
    """The pids still mapping `region` once only `holder` (or none) does, or after `timeout` seconds (scaled)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        mappers = mapped_by(str(region)) if region.exists() else []
        if set(mappers) <= {holder} or time.monotonic() > deadline:
            return mappers
        time.sleep(0.5)


_KEPT_REGIONS: list[str] = []  # pools to remove after the session server has exited


@atexit.register
def _remove_kept_regions(timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s  # the stubs exit a moment after the server
    left = [r for r in _KEPT_REGIONS if (Path("/dev/shm") / r).exists()]
    while left and time.monotonic() < deadline:
        left = [r for r in left if not free_shm_region(r) and (Path("/dev/shm") / r).exists()]
        time.sleep(0.5 if left else 0)


@pytest.mark.parametrize(
    "entry, victim",
    [
        (SPARK_STREAM, SPARK_STREAM),
        (SPARK_STREAM, LLM_STREAM),
        (SPARK_STREAM, VOCODER),
        (COSY_STREAM, COSY_TOKEN2WAV),
    ],
)
def test_a_stub_killed_under_four_streams_fails_them_cleanly_and_the_model_comes_back(
    server, reference, entry, victim
):
    server.restart_if_aborted()
    triton, watchdog = server, server.watchdog
    done = len(watchdog.actions())
    arrays = spark_arrays(reference)
    streams = [Stream(triton.grpc_url, entry, arrays, ["waveform"]) for _ in range(4)]
    first = streams[0].read(limit=1, timeout=SILENCE_S)  # the first stream is mid-way
    assert first.error is None, first.error
    with a_lock_abort_fails_expectedly(server, victim):
        region = Path("/dev/shm") / kill_stub(triton.server, victim).shm_region
        killed = time.monotonic()
        outcomes = [read_outcome(s, SILENCE_S) for s in streams]
        ended_s = [round(s.result.finished - killed, 2) for s in streams]
        assert not [o for o in outcomes if o[0] == "hang"], outcomes
        errors = [message for kind, message in outcomes if kind == "error"]
        assert errors, f"killing {victim} under four streams failed none of them: {outcomes}"
        assert all("not healthy" in e for e in errors), errors

        actions = watchdog.wait_for_model(victim, done)
        recovered_s = round(time.monotonic() - killed, 1)
        assert actions and all(a["action"] == "reload" and a["ok"] for a in actions), actions
        watchdog.wait_quiet()  # a BLS that waited on the victim exited too (CalleeMonitor): reloaded as well

        def one(_):
            return read_outcome(Stream(triton.grpc_url, entry, arrays, ["waveform"]), SILENCE_S)

        with ThreadPoolExecutor(2) as pool:
            after = list(pool.map(one, range(NEXT_REQUESTS)))
        # 2.51 keeps the dead stub's pool mapped while the requests it held are unanswered (the server's own
        # mapping; the watchdog removes the file once the server exits, see the next test); nothing else maps it
        mappers = wait_unmapped(region, triton.server.pid)
        kept = region.exists()
        record(
            "stub_killed",
            model=victim,
            streams=len(streams),
            failed=len(errors),
            completed=sum(o[0] == "ok" for o in outcomes),
            hung=0,
            stream_end_after_kill_s=ended_s,
            reloaded_after_s=recovered_s,
            models_reloaded=sorted({a["model"] for a in json_lines(watchdog.actions()[done:])}),
            next_requests=len(after),
            next_ok=sum(o[0] == "ok" for o in after),
            pool_kept_until_server_exit=kept,
            pool_mib=round(region.stat().st_blocks * 512 / 2**20, 1) if kept else 0,
        )
        assert [o for o in after if o[0] != "ok"] == [], after
        assert set(mappers) <= {triton.server.pid}, f"{region} is mapped by {mappers}"
        if kept:
            _KEPT_REGIONS.append(region.name)
            wait_until(  # the watchdog's log names the pool it will remove once the server has exited
                watchdog.log_path.read_text,
                lambda text: region.name in text,
                f"the watchdog's log to name the dead stub's pool {region.name} (it lost track of it)",
            )


class AbortedOnTheDeadStubsLock(AssertionError):
    """tritonserver 2.51 aborted (`boost::interprocess::lock_exception`) on the lock of a stub killed while it
    held it: the server's end, not the watchdog's (docs/tests.md)."""


def aborted_on_the_dead_stubs_lock(error: BaseException | None) -> bool:
    return isinstance(error, AbortedOnTheDeadStubsLock)


@pytest.mark.flaky(reruns=1, condition=aborted_on_the_dead_stubs_lock)
def test_the_watchdog_removes_a_dead_stubs_pool_once_the_server_has_exited(tmp_path, reference):
    """A BLS stub killed mid-stream: after the reload tritonserver still maps its pool, and 2.51 leaves the file
    in /dev/shm when it exits; the watchdog, which outlives the server, removes it then."""
    repo = tmp_path / "repo"
    build_reliability_models(repo, tmp_path / "data")
    http_port, grpc_port, metrics_port = free_ports(3)
    config = ServerConfig(
        repo,
        http_port,
        grpc_port,
        metrics_port,
        log_file=tmp_path / "log",
        model_control_mode="explicit",
        exit_timeout_s=5,
    )
    with TritonServer(config) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600.0)
        for model in (TOKENIZER, VOCODER, LLM_STREAM, SPARK_STREAM):
            client.load_model(model)
        watchdog = WatchdogProcess(server, tmp_path / "events.jsonl")
        stream = Stream(server.grpc_url, SPARK_STREAM, spark_arrays(reference), ["waveform"])
        assert stream.read(limit=1, timeout=SILENCE_S).error is None
        victims = [s for s in current_stubs(server.pid).values() if s.model == SPARK_STREAM]
        for victim in victims:  # both instances: the one serving the stream among them
            os.kill(victim.pid, signal.SIGKILL)
        assert read_outcome(stream, SILENCE_S)[0] == "error"
        actions = watchdog.wait_for_model(SPARK_STREAM, 0)
        if not actions and aborted_on_a_lock(server):
            raise AbortedOnTheDeadStubsLock(config.log_file.read_text(errors="replace")[-3000:])
        assert actions and actions[0]["action"] == "reload" and actions[0]["ok"], actions
        regions = [Path("/dev/shm") / v.shm_region for v in victims]
        kept = [r for r in regions if wait_unmapped(r, -1, timeout=5) == [server.pid]]
        assert kept, "2.51 freed the pool of the stub that served the stream: update README"
        server_pid = server.pid
        pools = [Path("/dev/shm") / s.shm_region for s in list_stubs(server.pid)]
    try:
        watchdog.process.wait(timeout=60)  # it ends with the server, after its last sweep
    except subprocess.TimeoutExpired:
        pytest.fail("the watchdog outlived the server")
    finally:
        watchdog.stop()
    assert not is_tritonserver(server_pid)
    assert not [r for r in regions if r.exists()], f"left behind: {watchdog.log_path.read_text()[-2000:]}"
    left = {p.name: mapped_by(str(p)) for p in pools if p.exists()}
    assert not left, (
        f"pools of the server's stubs left behind: {left}; {watchdog.log_path.read_text()[-1500:]}"
    )


def test_where_the_model_cannot_be_reloaded_the_watchdog_turns_readiness_false(tmp_path):
    """A server without explicit model control: the reload is refused, the watchdog stops the server."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "infra_echo").symlink_to(TRITON_MODELS_DIR / "infra_echo", target_is_directory=True)
    http_port, grpc_port, metrics_port = free_ports(3)
    config = ServerConfig(
        repo, http_port, grpc_port, metrics_port, log_file=tmp_path / "log", exit_timeout_s=5
    )
    with TritonServer(config) as server:
        watchdog = WatchdogProcess(server, tmp_path / "events.jsonl")
        try:
            kill_stub(server, "infra_echo")
            actions = watchdog.wait_for_model("infra_echo", 0)
            assert actions and actions[0]["action"] == "exit", actions
            try:
                server.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("the watchdog's SIGTERM did not stop the server")
            assert not is_ready(server.http_url)
        finally:
            watchdog.stop()
    assert "reload" in (tmp_path / "events.log").read_text()
