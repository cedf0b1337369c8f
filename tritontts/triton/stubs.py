"""The python-backend stub processes of a tritonserver, read from /proc.

A stub's command line is `triton_python_backend_stub <repo>/<model>/<version>/model.py <shm region> <shm size>
<shm growth> <server pid> <backend dir> <ipc size> <instance name> <kind>` (python_backend r24.x); the stubs
are the server's children, so a stub reads its siblings with `parent_pid=os.getppid()`.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STUB_BINARY = "triton_python_backend_stub"


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str  # the model's directory name in the repository, which is its name
    instance: str  # e.g. spark_tts_0_1
    shm_region: str = ""  # its shared-memory pool, /dev/shm/<shm_region>
    started: int = (
        0  # start time (clock ticks after boot): of two stubs named alike, the later one is current
    )

    @property
    def runs_an_instance(self) -> bool:
        """False for the stub the python backend runs for a model itself, named after it, while the model loads
        (its auto_complete_config): it exits by design once the model's instances start."""
        return self.instance != self.model


def _process(pid: int) -> tuple[int, str, int, list[str]] | None:
    """(parent pid, state, start time, argv) of a live process, None when gone or unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[
        1
    ].split()  # fields[0] is stat's 3rd field (state), [19] its 22nd (starttime)
    return int(fields[1]), fields[0], int(fields[19]), [a.decode(errors="replace") for a in argv if a]


def _live_stubs() -> Iterator[tuple[int, Path, Stub]]:
    """(parent pid, model.py path, stub) of every live (not zombie) stub on the machine."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        process = _process(int(entry))
        if process is None:
            continue
        parent, state, started, argv = process
        if state == "Z" or len(argv) < 9 or os.path.basename(argv[0]) != STUB_BINARY:
            continue
        model_py = Path(argv[1])
        yield parent, model_py, Stub(int(entry), model_py.parent.parent.name, argv[8], argv[2], started)


def list_stubs(parent_pid: int) -> list[Stub]:
    """The live (not zombie) stubs whose parent is `parent_pid`, oldest first.

    After a reload the old version's stubs may live on beside the new ones under the same instance names: 2.51
    keeps an old instance (its stub and shared memory) while requests that a killed stub held are unanswered."""
    stubs = [stub for parent, _, stub in _live_stubs() if parent == parent_pid]
    return sorted(stubs, key=lambda s: (s.started, s.pid))


def stubs_serving(repo: Path) -> list[Stub]:
    """The live stubs of models under the repository `repo`, whatever their parent: a stub that outlived its
    server has been re-parented."""
    return [stub for _, model_py, stub in _live_stubs() if repo in model_py.parents]


def current_stubs(parent_pid: int) -> dict[str, Stub]:
    """The newest live stub of each instance name: the one serving it."""
    return {s.instance: s for s in list_stubs(parent_pid)}


def free_shm_region(name: str) -> bool:
    """Remove /dev/shm/<name> when no process maps it any more: a killed stub's pool (64 MiB by default) is
    never removed by tritonserver 2.51. True when removed."""
    path = f"/dev/shm/{name}"
    if not name.startswith("triton_python_backend_shm_region_") or not os.path.exists(path):
        return False
    if mapped_by(path):
        return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def mapped_by(path: str) -> list[int]:
    """The pids of the processes that map the file `path` (read from /proc/<pid>/maps)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps", "rb") as maps:
                if path.encode() in maps.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stub_started(pid: int) -> int | None:
    """The start time of `pid` when it is a live stub process (to tell it from a later process reusing the pid)."""
    process = _process(pid)
    if process is None or process[1] == "Z" or not process[3]:
        return None
    return process[2] if os.path.basename(process[3][0]) == STUB_BINARY else None


def is_alive(pid: int) -> bool:
    process = _process(pid)
    return process is not None and process[1] != "Z"


class CalleeMonitor:
    """Fails a BLS stub fast when a model it waits on loses its stub.

    tritonserver 2.51 never answers the requests of a stub that died, and a BLS waiting on them (a decoupled
    model's responses above all) would wait for ever, holding its instance and its client. Python-backend calls
    are not safe to make from a second thread of a stub (shared-memory corruption), so the wait cannot be given a
    timeout; instead one monitor thread, which makes no such calls, checks every `interval_s` the stubs serving
    each call in flight, and when one of them is gone it exits this stub: Triton then fails this instance's
    requests ("Stub process ... is not healthy") and tritontts.triton.watchdog reloads both models.
    """

    def __init__(self, interval_s: float = 1.0, exit: Callable[[str], None] | None = None) -> None:
        self.interval_s = interval_s
        self.exit = exit or _exit_stub
        self.parent = os.getppid()
        self.stubs: dict[str, list[int]] = {}
        self.watches: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.lock = threading.Lock()
        self._ids = itertools.count()
        self._refresh()
        threading.Thread(target=self._run, name="callee-monitor", daemon=True).start()

    def _refresh(self) -> None:
        stubs: dict[str, list[int]] = {}
        for stub in list_stubs(self.parent):
            stubs.setdefault(stub.model, []).append(stub.pid)
        self.stubs = stubs

    @contextmanager
    def watching(self, model: str) -> Iterator[None]:
        """While inside, the death of any stub `model` has now ends this stub."""
        key = next(self._ids)
        with self.lock:
            self.watches[key] = (model, tuple(self.stubs.get(model, ())))
        try:
            yield
        finally:
            with self.lock:
                self.watches.pop(key, None)

    def check(self) -> None:
        with self.lock:
            watches = list(self.watches.values())
        for model, pids in watches:
            dead = [pid for pid in pids if not is_alive(pid)]
            if dead:
                self.exit(
                    f"tritontts: the stub of model '{model}' (pid {dead[0]}) died while this stub waited for its "
                    "response; exiting so that Triton fails this instance's requests instead of holding them "
                    "for ever (tritontts.triton.watchdog reloads both models)"
                )
                return

    def _run(self) -> None:
        name_os_thread(b"callee-monitor")
        while True:
            time.sleep(self.interval_s)
            self.check()
            self._refresh()


def _exit_stub(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    os._exit(70)


def in_stub() -> bool:
    """Whether this process is a python-backend stub."""
    try:
        return os.path.basename(os.readlink("/proc/self/exe")) == STUB_BINARY
    except OSError:
        return False


def end_stub_process() -> None:
    """The last call of a model's `finalize`: end this stub process now; outside a stub it does nothing.

    By the time `finalize` runs the stub has answered the server's finalize request, and the server waits for
    the process to exit, one instance after another, each after a 1 s health check (python_backend's
    `UpdateHealth`). The interpreter's own teardown of a stub that imported torch adds about 0.6 s per instance:
    16 BLS instances took 28 s to unload, past tritonserver's 30 s exit timeout ("failed to stop server"), and
    that teardown is where the faults at unload came from. What the model holds was released by `finalize`."""
    if not in_stub():
        return
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def name_os_thread(name: bytes) -> None:
    """Name the calling thread for the OS (/proc/<pid>/task/<tid>/comm, `top -H`; at most 15 bytes), where libc
    allows it."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, ctypes.c_char_p(name[:15]), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


_monitor: CalleeMonitor | None = None
_monitor_lock = threading.Lock()


def callee_monitor() -> CalleeMonitor:
    """The stub's one monitor, started on first use."""
    global _monitor
    with _monitor_lock:
        if _monitor is None:
            _monitor = CalleeMonitor()
        return _monitor
