"""Starting, watching and stopping one tritonserver process."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tritontts.processes import process_argv
from tritontts.triton.bundle import TritonInstall, find_tritonserver
from tritontts.triton.unload import exit_timeout_for, exit_timeout_of

LOOPBACK = "127.0.0.1"
PYTHON_SHM_BYTES = 64 * 2**20
"""Each python-backend stub's shared-memory pool from the start (the backend's default is 1 MiB, grown in 1 MiB
steps). Growing remaps the pool while other threads of the stub may use it; BLS stubs crashed that way."""
PYTHON_SHM_GROWTH_BYTES = 16 * 2**20
_ERROR_LINE = re.compile(r"^E\d{4} |^error: ")


class ServerError(RuntimeError):
    """The server did not start, died, or did not become ready in time."""


@dataclass
class ServerConfig:
    model_repo: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    address: str = LOOPBACK  # --http-address / --grpc-address / --metrics-address
    log_file: Path | None = None
    pid_file: Path | None = None
    log_verbose: int = 0
    model_control_mode: str | None = None  # none | poll | explicit
    exit_timeout_s: int | None = None  # SIGTERM to exit (requests, unload); None: tritontts.triton.unload
    python_shm_bytes: int = PYTHON_SHM_BYTES
    python_shm_growth_bytes: int = PYTHON_SHM_GROWTH_BYTES
    extra_args: tuple[str, ...] = ()


class TritonServer:
    """One tritonserver process in its own session; `with TritonServer(cfg) as s:` starts and waits for it."""

    def __init__(self, config: ServerConfig, install: TritonInstall | None = None) -> None:
        self.config = config
        self.install = install
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def http_url(self) -> str:
        return f"{client_host(self.config.address)}:{self.config.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.config.address)}:{self.config.grpc_port}"

    def command(self) -> list[str]:
        cfg = self.config
        install = self.install or find_tritonserver()
        cmd = [
            str(install.binary),
            f"--model-repository={Path(cfg.model_repo).resolve()}",
            f"--http-address={cfg.address}",
            f"--http-port={cfg.http_port}",
            f"--grpc-address={cfg.address}",
            f"--grpc-port={cfg.grpc_port}",
            f"--metrics-address={cfg.address}",
            f"--metrics-port={cfg.metrics_port}",
            f"--log-verbose={cfg.log_verbose}",
            f"--backend-config=python,shm-default-byte-size={cfg.python_shm_bytes}",
            f"--backend-config=python,shm-growth-byte-size={cfg.python_shm_growth_bytes}",
            *install.server_args(),
        ]
        if cfg.model_control_mode:
            cmd.append(f"--model-control-mode={cfg.model_control_mode}")
        if exit_timeout_of(list(cfg.extra_args)) is None:
            timeout = (
                cfg.exit_timeout_s if cfg.exit_timeout_s is not None else exit_timeout_for(cfg.model_repo)
            )
            cmd.append(f"--exit-timeout-secs={timeout}")
        return [*cmd, *cfg.extra_args]

    def start(self) -> int:
        """Launch the server in the background; returns its pid (also written to the pid file)."""
        if self.process is not None and self.process.poll() is None:
            raise ServerError(f"tritonserver already running (pid {self.process.pid})")
        if not Path(self.config.model_repo).is_dir():
            raise ServerError(f"model repository not found: {self.config.model_repo}")
        if self.install is None:
            self.install = find_tritonserver()
        log_path = self.config.log_file or Path(self.config.model_repo).resolve().parent / "tritonserver.log"
        self.config.log_file = Path(log_path)
        self.config.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.config.log_file, "wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.install.environment(),
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        if self.config.pid_file:
            Path(self.config.pid_file).parent.mkdir(parents=True, exist_ok=True)
            Path(self.config.pid_file).write_text(f"{self.process.pid}\n")
        return self.process.pid

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Poll `/v2/health/ready` until it answers 200; returns the seconds since start."""
        if self.process is None:
            raise ServerError("wait_ready() before start()")
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise ServerError(
                    f"tritonserver exited with code {code} before it was ready\n{self.log_tail()}"
                )
            if is_ready(self.http_url):
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                raise ServerError(f"tritonserver not ready after {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM this server, SIGKILL its session after `grace_s` (default: its exit timeout and 10 s); returns
        the exit code."""
        if self.process is None:
            return None
        if grace_s is None:
            grace_s = stop_grace_s(exit_timeout_of(process_argv(self.process.pid)))
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _kill_session(self.process.pid)
                self.process.wait(timeout=10)
        _remove_pid_file(self.config.pid_file, self.process.pid)
        return self.process.returncode

    def log_tail(self) -> str:
        return log_tail(self.config.log_file)

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop(grace_s=5)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def answers_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether a GET of `url` (no proxy) answers 200 within `timeout`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as reply:
            return reply.status == 200
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError, OSError):
        return False  # HTTPException: e.g. a probe of a free ephemeral port that connected to itself (no HTTP reply)


def is_ready(http_url: str, timeout: float = 2.0) -> bool:
    return answers_ok(f"http://{http_url}/v2/health/ready", timeout)


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports that are free on `host` right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def read_pid_file(pid_file: str | Path) -> int | None:
    try:
        return int(Path(pid_file).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def is_tritonserver(pid: int) -> bool:
    """Whether `pid` is alive and is a tritonserver (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    argv0 = cmdline.split(b"\0", 1)[0]
    return state != "Z" and os.path.basename(argv0) == b"tritonserver"


def stop_grace_s(exit_timeout_s: int | None) -> float:
    """How long to wait after SIGTERM before SIGKILL: the server's own exit timeout and 10 s."""
    return float(max(40, (exit_timeout_s or 30) + 10))


def stop_pid(pid: int, grace_s: float | None = None) -> bool:
    """SIGTERM the tritonserver `pid` (not our child), SIGKILL its session after `grace_s` (default: its
    `--exit-timeout-secs` and 10 s); False if not running."""
    if not is_tritonserver(pid):
        return False
    if grace_s is None:
        grace_s = stop_grace_s(exit_timeout_of(process_argv(pid)))
    os.kill(pid, signal.SIGTERM)
    if _wait_gone(pid, grace_s):
        return True
    _kill_session(pid)
    if not _wait_gone(pid, 10):
        raise ServerError(f"tritonserver pid {pid} survived SIGKILL")
    return True


def stop_pid_file(pid_file: str | Path, grace_s: float | None = None) -> int | None:
    """Stop the server named by the pid file and remove the file; returns the pid it stopped, if any."""
    pid = read_pid_file(pid_file)
    stopped = pid is not None and stop_pid(pid, grace_s)
    _remove_pid_file(pid_file, pid)
    return pid if stopped else None


def log_tail(log_file: str | Path | None, chars: int = 4000) -> str:
    """The server's error lines (`E<date> ...`) and the end of its log, for error messages."""
    if log_file is None or not Path(log_file).exists():
        return "(no server log)"
    text = Path(log_file).read_bytes().decode("utf-8", errors="replace")
    errors = [line[:1500] for line in text.splitlines() if _ERROR_LINE.match(line)][-10:]
    parts = []
    if errors:
        parts.append(f"--- errors in {log_file} ---\n" + "\n".join(errors))
    parts.append(f"--- end of {log_file} ---\n" + text[-chars:])
    return "\n".join(parts)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_tritonserver(pid):
            return True
        time.sleep(0.1)
    return not is_tritonserver(pid)


def _kill_session(pid: int) -> None:
    """SIGKILL the server and the python-backend stubs of the session it leads (it was started with setsid)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _remove_pid_file(pid_file: str | Path | None, pid: int | None) -> None:
    if pid_file and read_pid_file(pid_file) == pid:
        Path(pid_file).unlink(missing_ok=True)


def client_host(address: str) -> str:
    """Where a client on this machine reaches a server that listens on `address`."""
    return LOOPBACK if address in ("0.0.0.0", "") else address
