"""Shared fixtures: one real tritonserver for the whole test session.

A test module that needs models on the server declares them at module level,

    TRITON_MODELS = [TRITON_MODELS_DIR / "infra_echo", build_spark_models]

each entry being a model dir (symlinked into the repository under its own name) or a callable
`build(repo_dir: Path, data_dir: Path) -> None` that writes model dirs into `repo_dir` (filled templates,
say) and anything they need (synthetic checkpoints) under `data_dir`. The session fixture `triton` gathers
the entries of every module whose tests were selected, builds one repository, starts one server in
explicit model-control mode, and each module loads what it uses:

    @pytest.fixture(scope="module")
    def server(triton):
        return triton.load("infra_echo")

A model that fails to load fails only the tests that load it, with the server's error lines in the message.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from leftover_stubs import kill_leftover_stubs
from tolerance import SERVER_TORCH_THREADS
from triton_stubs import signal_and_read_log
from waiting import scaled, wait_until

# Every tritonserver, stub and run.sh the tests start inherits this: OpenMP threads that sleep when idle instead of
# spinning, so the many stubs of a test server do not take the 2 cores from each other (on CI's machine a routed
# token2wav test went from 48.5 to 10.2 s). It changes no result: the kernels and thread counts are the same.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tritontts.triton.server import ServerConfig, ServerError, TritonServer, free_ports
from tritontts.triton.stubs import free_shm_region, list_stubs, stubs_serving

pytest_plugins = ["peak_memory"]

TRITON_MODELS_DIR = Path(__file__).parent / "triton_models"
SERVER_MALLOC_ARENAS = "2"  # run.sh --server_malloc_arena_max's default
UNLOAD_BELOW_AVAILABLE_GIB = float(os.environ.get("TRITONTTS_TEST_UNLOAD_BELOW_GIB", "10"))


def echo_shaped_model(repo: Path, name: str, model_py: str) -> None:
    """A python model `name` in `repo` with infra_echo's inputs, outputs and config, and `model_py` as its code."""
    shutil.copytree(TRITON_MODELS_DIR / "infra_echo", repo / name, ignore=shutil.ignore_patterns("*.pyc"))
    config = repo / name / "config.pbtxt"
    config.write_text(config.read_text().replace('"infra_echo"', f'"{name}"'))
    (repo / name / "1" / "model.py").write_text(model_py)


def echo(url: str, x=None):
    """infra_echo's Y (its `scale` times X) for X = `x` (default 0, 1, 2), over HTTP."""
    import numpy as np
    import tritonclient.http as httpclient

    x = np.arange(3, dtype=np.float32) if x is None else x
    client = httpclient.InferenceServerClient(url)
    inputs = [httpclient.InferInput("X", list(x.shape), "FP32"), httpclient.InferInput("TEXT", [1], "BYTES")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(np.array([b"t"], dtype=object))
    try:
        return client.infer("infra_echo", inputs).as_numpy("Y")
    finally:
        client.close()


class StuckUnload(UserWarning):
    """A model of the session server that did not unload in time: the server started again without it."""


class ServerDied(UserWarning):
    """The session server had died: it started again (restart_if_dead)."""


class StubTakenForDead(UserWarning):
    """The session server failed a request of a stub that still runs: it started again before the rerun."""


class StuckLoad(UserWarning):
    """A model of the session server whose load did not end in time: the server started again and loaded it once
    more."""


LOAD_TIMEOUT_S = 240.0
"""A model load on the session server (a few seconds; a minute on the loaded 2-core machine) past this is stuck."""


@dataclass
class RunningTriton:
    server: TritonServer
    repo: Path
    loaded: set[str] = field(default_factory=set)
    module_loads: set[str] = field(default_factory=set)
    """the models the running test module asked for (loaded by it or before it)"""
    kept: set[str] = field(default_factory=set)
    """models never unloaded to free memory (the reliability suite's: their queues may hold abandoned requests)"""
    restarts: list[Path] = field(default_factory=list)
    """the logs of the servers it replaced (`restart_if_dead`, `restart`), kept beside its log"""
    pools: set[str] = field(default_factory=set)
    """the shared-memory pools of the stubs it started (/dev/shm; a server that dies leaves them)"""

    @property
    def http_url(self) -> str:
        return self.server.http_url

    @property
    def grpc_url(self) -> str:
        return self.server.grpc_url

    def load(self, *names: str, timeout: float = LOAD_TIMEOUT_S) -> RunningTriton:
        """Load models of the session repository (once each); raises with the server log on failure. A load
        that takes over `timeout` s is reported (a StuckLoad warning with its stubs' stacks), and the server
        starts again and loads the model once more: a token2wav model's initialize hung twice in suite runs."""
        self.module_loads.update(names)
        self.restart_if_dead()  # a module set up again after the server died under its first setup
        for name in names:
            if name in self.loaded:
                continue
            if not (self.repo / name).exists():
                raise ServerError(
                    f"model '{name}' is not in the session repository {self.repo}; add it to TRITON_MODELS"
                )
            try:
                self._load_one(name, timeout)
            except TimeoutError:
                stuck = f"loading {name} took over {timeout:.0f} s{self.stuck_stacks([name])}"
                warnings.warn(
                    StuckLoad(f"{stuck}\nthe session server starts again and loads it once more"),
                    stacklevel=2,
                )
                self.restart()
                self._load_one(name, timeout)
            self.loaded.add(name)
        self.pools.update(stub.shm_region for stub in list_stubs(self.server.pid) if stub.shm_region)
        return self

    def _load_one(self, name: str, timeout: float) -> None:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        client = httpclient.InferenceServerClient(self.http_url, network_timeout=timeout)
        try:
            client.load_model(name)
        except InferenceServerException as err:
            raise ServerError(f"loading model '{name}' failed: {err}\n{self.server.log_tail()}") from err
        finally:
            client.close()

    def died_of_a_python_backend_crash(self) -> bool:
        """Whether the server is dead of one of tritonserver 2.51's python-backend crashes under load
        (docs/tests.md): a segmentation fault or abort in TRITONBACKEND_ResponseSend (a late response for a
        request the backend had failed, having taken its starved stub for unhealthy), a segmentation fault
        inside the python backend's execute or a BLS request's submission, or the abort on a dead stub's pool
        lock (python_backend_crash)."""
        log = self.server.config.log_file
        if self.server.process is None or self.server.process.poll() is None or log is None:
            return False
        return python_backend_crash(log.read_text(errors="replace"))

    def exited_after(self, error: BaseException | None, timeout_s: float = 30.0) -> bool:
        """Whether the server has exited, waiting up to `timeout_s` (scaled) for it when `error` is a lost
        connection: a client sees the socket close as tritonserver's crash handler starts, which prints a stack
        (seconds on a loaded machine) before the process ends."""
        process = self.server.process
        if process is None:
            return False
        if error is not None and LOST_CONNECTION.search(str(error)):
            try:
                process.wait(timeout=scaled(timeout_s))
            except subprocess.TimeoutExpired:
                pass
        return process.poll() is not None

    def state(self) -> str:
        """For a failing test's message: whether the server runs, and its log's errors and end."""
        process = self.server.process
        code = None if process is None else process.poll()
        running = "runs" if code is None else f"exited with code {code}"
        return f"tritonserver {running}; its log:\n{self.server.log_tail()}"

    def took_a_live_stub_for_dead(self, error: BaseException | None) -> bool:
        """Whether `error` is the python backend's "Stub process '<instance>' is not healthy" for a stub of this
        server that still runs: tritonserver 2.51 fails a request when the stub's health thread was not scheduled
        within a second (a starved 2-core machine), not only when the stub died (docs/tests.md)."""
        match = UNHEALTHY_STUB.search(str(error)) if error is not None else None
        if match is None or self.server.pid is None:
            return False
        return any(stub.instance == match.group(1) for stub in list_stubs(self.server.pid))

    def restart_after_a_stub_taken_for_dead(self, error: BaseException | None) -> bool:
        """Whether `error` is a stub of this server that still runs taken for dead; if so the server starts again
        first (a `StubTakenForDead` warning): that stub's late answer to the request the backend failed would crash
        tritonserver 2.51 in TRITONBACKEND_ResponseSend, under the rerun (docs/tests.md)."""
        if not self.took_a_live_stub_for_dead(error):
            return False
        warnings.warn(StubTakenForDead(f"{error}; the session server starts again"), stacklevel=2)
        self.restart()
        return True

    def restart_if_dead(self) -> bool:
        """Start the server again when it has died, on the same ports (the URLs tests and API processes hold
        stay valid), with the models it had loaded; its log moves aside first. True when it restarted. A
        `ServerDied` warning carries how it ended and its log's end (CI's output keeps no server log)."""
        if self.server.process is None or self.server.process.poll() is None:
            return False
        warnings.warn(ServerDied(f"the session server died; {self.state()}"), stacklevel=2)
        self._start_again()
        return True

    def restart(self) -> None:
        """Stop the server and start it again as `restart_if_dead` does."""
        self.server.stop(grace_s=15)
        self._start_again()

    def _start_again(self) -> None:
        log = self.server.config.log_file
        kept_log = log.with_name(f"{log.stem}.died{len(self.restarts) + 1}{log.suffix}")
        log.rename(kept_log)
        self.restarts.append(kept_log)
        kill_leftover_stubs(self.repo)
        self._remove_pools()
        start_with_server_threads(self.server)
        self.server.wait_ready(timeout=scaled(120))
        models, self.loaded = sorted(self.loaded), set()
        module_loads = set(self.module_loads)
        self.load(*models)
        self.module_loads = module_loads

    def _remove_pools(self, timeout_s: float = 15.0) -> None:
        """Remove the pools of the dead server's stubs once nothing maps them (its killed stubs exit a moment
        later); 64 MiB each, in memory."""
        deadline = time.monotonic() + scaled(timeout_s)
        left = self.pools
        while left and time.monotonic() < deadline:
            left = {p for p in left if not free_shm_region(p) and (Path("/dev/shm") / p).exists()}
            time.sleep(0.2 if left else 0)
        self.pools = set()

    def unload(self, *names: str, timeout: float = 60.0) -> None:
        """Unload models this session loaded, waiting (`timeout` s) until their stubs are gone. Models still there
        then are reported (a StuckUnload warning with their stubs' stacks) and the server starts again without them:
        one stuck unload held later loads up, once for the 600 s of a load's timeout."""
        import tritonclient.http as httpclient

        names = tuple(name for name in names if name in self.loaded)
        if not names:
            return
        client = httpclient.InferenceServerClient(self.http_url, network_timeout=600.0)
        try:
            for name in names:
                client.unload_model(name)
                self.loaded.discard(name)

            def still_there() -> list[str]:
                return [
                    m["name"]
                    for m in client.get_model_repository_index()
                    if m["name"] in names and m.get("state") in ("READY", "UNLOADING")
                ]

            try:
                wait_until(
                    still_there,
                    lambda models: not models,
                    what=f"unloading {', '.join(names)}",
                    timeout=timeout,
                    interval=0.2,
                )
            except AssertionError as err:
                stuck = f"{err}{self.stuck_stacks(still_there())}"
                warnings.warn(
                    StuckUnload(f"{stuck}\nthe session server starts again without them"), stacklevel=2
                )
                self.restart()
        finally:
            client.close()

    def stuck_stacks(self, models: list[str]) -> str:
        """Every thread's stack of the stubs of `models` still running (each stub prints them to the server log on
        SIGUSR1: tritontts.triton.debug, a "(most recent call first)" line a thread), read from what the log gained."""
        stubs = [stub for stub in stubs_serving(self.repo) if stub.model in models]
        try:
            added = signal_and_read_log(
                self.server,
                [stub.pid for stub in stubs],
                signal.SIGUSR1,
                lambda added: added.count("most recent call first") >= len(stubs),
                "a stack from each stub still running",
                timeout=10,
            )
        except AssertionError as err:
            added = str(err)
        return f"\n--- stubs still running: {[s.instance for s in stubs]}; their stacks ---\n{added[-12000:]}"


_SESSION_SERVERS: list[RunningTriton] = []  # the session's server once the `triton` fixture started it
_PYTHON_BACKEND_CRASH = re.compile(
    r"Signal \((?:11|6)\) received\.(?:\n.*){0,12}TRITONBACKEND_ResponseSend"
    r"|Signal \(11\) received\.(?:\n.*){0,12}TRITONBACKEND_ModelInstanceExecute in \S*/libtriton_python\.so"
    r"|Signal \(11\) received\.(?:\n.*){0,12}TRITONSERVER_ServerInferAsync in .*\n.*/libtriton_python\.so"
    r"|lock_exception'\n.*what\(\):  boost::interprocess::lock_exception\nSignal \(6\) received\."
)
UNHEALTHY_STUB = re.compile(r"Stub process '([^']+)' is not healthy")
LOST_CONNECTION = re.compile(
    r"StatusCode\.UNAVAILABLE|Socket closed|Connection refused|failed to connect|connection closed"
)


def python_backend_crash(log_text: str) -> bool:
    """Whether a tritonserver log ends in a segmentation fault or abort inside TRITONBACKEND_ResponseSend, in a
    segmentation fault inside the python backend's TRITONBACKEND_ModelInstanceExecute or under a BLS request's
    TRITONSERVER_ServerInferAsync, or in the abort on a dead stub's pool lock (boost::interprocess::lock_exception)."""
    return _PYTHON_BACKEND_CRASH.search(log_text) is not None


def _session_server_hit_a_python_backend_fault(error: BaseException | None) -> bool:
    """The rerun condition of the session server's tests (pytest_collection_modifyitems): the server died of
    a python-backend crash (a server still dying when the test lost its connection is waited for), or failed
    the request of a stub that was only starved (the server then starts again before the rerun)."""
    if not _SESSION_SERVERS:
        return False
    server = _SESSION_SERVERS[0]
    server.exited_after(error)
    return server.died_of_a_python_backend_crash() or server.restart_after_a_stub_taken_for_dead(error)


def available_memory_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


@pytest.fixture(autouse=True, scope="module")
def _unload_after_module(request: pytest.FixtureRequest):
    """After a module's last test, its UNLOAD_AFTER models (no other module loads them) leave the session server;
    and while the machine has less than UNLOAD_BELOW_AVAILABLE_GIB free, so do all models the module did not ask
    for (a later module that wants one loads it again). Without this, the session server's stubs (150-320 MiB
    each, one per model) filled CI's 24 GiB machine before the last modules, and the kernel killed the run."""
    if _SESSION_SERVERS:
        _SESSION_SERVERS[0].restart_if_dead()
        _SESSION_SERVERS[0].module_loads.clear()
    yield
    if not _SESSION_SERVERS:
        return
    server = _SESSION_SERVERS[0]
    server.restart_if_dead()
    server.unload(*getattr(request.module, "UNLOAD_AFTER", ()))
    if available_memory_gib() < UNLOAD_BELOW_AVAILABLE_GIB:
        server.unload(*sorted(server.loaded - server.module_loads - server.kept))


def _module_entries(items: list[pytest.Item]) -> list[Path | Callable]:
    entries: list[Path | Callable] = []
    seen = set()
    for item in items:
        module = getattr(item, "module", None)
        if module is None or module.__name__ in seen:
            continue
        seen.add(module.__name__)
        entries.extend(e for e in getattr(module, "TRITON_MODELS", ()) if e not in entries)
    return entries


def build_repository(entries: list[Path | Callable], repo: Path, data_dir: Path) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if callable(entry):
            entry_data = data_dir / getattr(entry, "__name__", "build")
            entry_data.mkdir(parents=True, exist_ok=True)
            entry(repo, entry_data)
            continue
        source = Path(entry).resolve()
        target = repo / source.name
        if target.exists() or target.is_symlink():
            if target.resolve() == source:
                continue
            raise ValueError(
                f"two TRITON_MODELS entries are named '{source.name}': {target.resolve()} and {source}"
            )
        target.symlink_to(source, target_is_directory=True)


@pytest.fixture(scope="session")
def triton(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The session's tritonserver over the models of all selected modules' TRITON_MODELS (see module doc)."""
    root = tmp_path_factory.mktemp("triton")
    repo = root / "model_repo"
    build_repository(_module_entries(request.session.items), repo, root / "data")
    server = start_explicit_server(
        repo,
        root / "tritonserver.log",
        # as deploy/k8s serves: the first-response histogram (tritonserver 2.52 on; 2.51 ignores the key)
        extra_args=("--metrics-config=histogram_latencies=true",),
    )
    try:
        running = RunningTriton(server=server, repo=repo)
        _SESSION_SERVERS.append(running)
        yield running
    finally:
        _SESSION_SERVERS.clear()
        server.stop(grace_s=15)
        kill_leftover_stubs(repo)


def start_explicit_server(repo: Path, log_file: Path, extra_args: tuple[str, ...] = ()) -> TritonServer:
    """A tritonserver over `repo` on free ports, explicit model control and a 5 s exit timeout, started with
    the test servers' threads and arenas (start_with_server_threads); returns once it is ready."""
    http_port, grpc_port, metrics_port = free_ports(3)
    config = ServerConfig(
        model_repo=repo,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        log_file=log_file,
        model_control_mode="explicit",
        exit_timeout_s=5,
        extra_args=extra_args,
    )
    server = TritonServer(config)
    start_with_server_threads(server)
    try:
        server.wait_ready(timeout=scaled(120))
    except BaseException:
        server.stop(grace_s=15)
        raise
    return server


def start_with_server_threads(server: TritonServer) -> None:
    """Start `server` with OMP_NUM_THREADS at SERVER_TORCH_THREADS for it and its stubs, and glibc's malloc
    arenas capped as run.sh caps them (--server_malloc_arena_max 2, unless the environment sets it), then restore
    ours."""
    saved = {name: os.environ.get(name) for name in ("OMP_NUM_THREADS", "MALLOC_ARENA_MAX")}
    os.environ["OMP_NUM_THREADS"] = str(SERVER_TORCH_THREADS)
    os.environ.setdefault("MALLOC_ARENA_MAX", SERVER_MALLOC_ARENAS)
    try:
        server.start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _session_server_alive():
    """Before each test: a session server that died (of the crash `died_of_a_python_backend_crash` names, or
    any other) is started again, so one crash fails at most the test it happened in."""
    if _SESSION_SERVERS:
        _SESSION_SERVERS[0].restart_if_dead()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that use the session server, directly or through other fixtures, carry the `triton` mark, and run
    once more (pytest-rerunfailures, reported as a rerun) when it died during them of one of tritonserver 2.51's
    python-backend crashes, or failed them because it took a stub that still runs for dead; any other failure is
    final."""
    for item in items:
        if "triton" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.triton)
            item.add_marker(pytest.mark.flaky(reruns=1, condition=_session_server_hit_a_python_backend_fault))


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
PROMPT_ZH = SHARED_DATA / "prompt_zh.wav"
PROMPT_ZH_TEXT = "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。豆奶牛奶换着喝，营养更均衡，本节目由豆本豆豆奶特约播出。"


@pytest.fixture(scope="session")
def spark_tiny_dir(tmp_path_factory) -> Path:
    """One tiny synthetic Spark-TTS checkpoint (official layout) for the whole session."""
    from tritontts.synthetic.spark import write_spark_checkpoint

    return write_spark_checkpoint(tmp_path_factory.mktemp("spark_tiny"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def prompt_zh() -> Path:
    if not PROMPT_ZH.exists():
        pytest.skip(f"{PROMPT_ZH} is missing (the shared/ folder beside the repository)")
    return PROMPT_ZH


@pytest.fixture(scope="session")
def bench_data(tmp_path_factory, prompt_zh) -> Path:
    """A 4-row benchmark dataset (seed_tts schema) written by scripts/make_benchmark_data.py."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("bench_data")
    script = Path(__file__).resolve().parents[1] / "scripts" / "make_benchmark_data.py"
    command = [sys.executable, str(script), "--output-dir", str(out), "--num-rows", "4", "--no-espeak"]
    subprocess.run([*command, "--prompt-wav", str(prompt_zh)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def one_torch_thread():
    """For modules of tiny models (`pytestmark = pytest.mark.usefixtures("one_torch_thread")`): they gain
    nothing from intra-op threads, and on a shared 2-core machine spinning OpenMP workers slow every op down.
    `TRITONTTS_TEST_THREADS` overrides the count (tests/golden_spread.py runs the golden tests with 1 and 2)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("TRITONTTS_TEST_THREADS", "1")))
    yield
    torch.set_num_threads(threads)
