"""Start, inspect and stop a multi-server deployment (disaggregated or co-located), remembered in a JSON state file.

`start` refuses while any process of an existing state file still runs (stop it first); a state file whose
processes are all gone is stale and replaced. It starts the LLM server (if any) and every tritonserver at once,
writes the state file (so `stop` finds them even if the launcher dies), waits for the LLM's `/health` and
each server's `/v2/health/ready`, and on any failure stops everything it started and removes the state file.
Beside each tritonserver runs a watchdog (tritontts.triton.watchdog, its log `<server log>.watchdog`): a stub that
dies is never restarted by tritonserver 2.51, and a server that dies leaves its stubs' pools in /dev/shm.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tritontts.triton.bundle import TritonInstall, find_tritonserver
from tritontts.triton.disaggregated.plan import Topology, describe
from tritontts.triton.disaggregated.processes import ProcessRef, Spawned, spawn, stop
from tritontts.triton.server import answers_ok, is_ready, log_tail
from tritontts.triton.watchdog import start_beside

STATE_VERSION = 1
POLL_S = 0.3
EXIT_NOT_RUNNING = 3
EXIT_DEGRADED = 1


def watchdog_log(entry: dict) -> Path:
    return Path(f"{entry['log']}.watchdog")


class LaunchError(RuntimeError):
    """The deployment could not start (what ran was stopped again), or is already running."""


def llm_healthy(url: str, timeout: float = 2.0) -> bool:
    return answers_ok(f"{url}/health", timeout)


def read_state(state_file: Path) -> dict | None:
    try:
        state = json.loads(Path(state_file).read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as err:
        raise LaunchError(f"{state_file} is not a state file ({err}); remove it by hand") from err
    if state.get("version") != STATE_VERSION:
        raise LaunchError(f"{state_file} has state version {state.get('version')}, expected {STATE_VERSION}")
    return state


def write_state(state_file: Path, state: dict) -> None:
    tmp = Path(f"{state_file}.tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(state_file)


@dataclass(frozen=True)
class Member:
    """One process of a state file: the LLM server or a token2wav server."""

    name: str
    entry: dict

    @property
    def ref(self) -> ProcessRef:
        return ProcessRef.from_dict(self.entry)

    @property
    def is_llm(self) -> bool:
        return self.name == "llm"

    def ready(self) -> bool:
        if self.is_llm:
            return llm_healthy(self.entry["url"])
        return is_ready(self.entry["http_url"])

    def where(self) -> str:
        if self.is_llm:
            return f"{self.entry['backend']} on GPUs {','.join(self.entry['gpus'])}, {self.entry['url']}"
        e = self.entry
        return f"GPU {e['gpu']}, grpc {e['grpc_url']}, http {e['http_port']}, metrics {e['metrics_port']}"


def members(state: dict) -> list[Member]:
    """The processes of a state file that were started (a launcher that died midway started only some)."""
    llm = [] if state["llm"] is None else [Member("llm", state["llm"])]
    everyone = [*llm, *(Member(s["name"], s) for s in state["servers"])]
    return [m for m in everyone if "pid" in m.entry]


def check_ports_free(topology: Topology) -> None:
    for port in topology.ports():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((topology.address, port))
            except OSError as err:
                raise LaunchError(f"port {port} on {topology.address} is taken ({err.strerror})") from err


def start(
    topology: Topology,
    state_file: Path,
    timeout_s: float = 600.0,
    install: TritonInstall | None = None,
    say: Callable[[str], None] = print,
    watchdog: str = "auto",
) -> dict:
    """Start the deployment and wait until all of it is ready; returns the state written to `state_file`.
    `watchdog`: each tritonserver's watchdog action (auto | reload | exit), or off for none."""
    state_file = Path(state_file)
    run_dir = state_file.parent
    existing = read_state(state_file)
    if existing is not None:
        running = [m.name for m in members(existing) if m.ref.alive()]
        if running:
            raise LaunchError(
                f"servers are already running from {state_file} ({', '.join(running)}); stop them "
                f"first (bash run.sh stop, or scripts/disaggregated.py stop --state-file {state_file})"
            )
        say(f"replacing the stale state file {state_file} (none of its processes runs)")
    if not Path(topology.model_repo).is_dir():
        raise LaunchError(f"model repository not found: {topology.model_repo}")
    if topology.llm is not None:
        topology.llm.check_runnable()
    check_ports_free(topology)
    install = install or find_tritonserver()
    run_dir.mkdir(parents=True, exist_ok=True)
    state = describe(topology, run_dir, install) | {"version": STATE_VERSION, "status": "starting"}
    spawned: dict[str, Spawned] = {}
    try:
        llm = topology.llm
        if llm is not None:
            spawned["llm"] = spawn(
                llm.command(), llm.environment(), Path(state["llm"]["log"]), Path(state["llm"]["pid_file"])
            )
            state["llm"] |= spawned["llm"].ref.to_dict()
            write_state(state_file, state)
        environments = {plan.name: plan.environment(install) for plan in topology.servers()}

        def launch(entry: dict) -> Spawned:
            spawned[entry["name"]] = spawn(
                entry["command"], environments[entry["name"]], Path(entry["log"]), Path(entry["pid_file"])
            )
            entry |= spawned[entry["name"]].ref.to_dict()
            if watchdog != "off":
                entry["watchdog_pid"] = start_beside(
                    entry["pid"], entry["http_url"], watchdog, watchdog_log(entry)
                )
            write_state(state_file, state)
            return spawned[entry["name"]]

        for entry in state["servers"]:
            launch(entry)
        started = f"{len(state['servers'])} tritonservers, {topology.layout}"
        say(f"started {started}{'' if llm is None else ' and the LLM server'}; state: {state_file}")
        _wait_ready(members(state), spawned, timeout_s, say, relaunch=launch)
    except BaseException:
        _stop_members([Member(name, s.ref.to_dict()) for name, s in spawned.items()])
        for s in spawned.values():
            s.process.wait()
        _remove_files(state)
        state_file.unlink(missing_ok=True)
        raise
    state["status"] = "ready"
    write_state(state_file, state)
    return state


def _wait_ready(
    pending: list[Member],
    spawned: dict[str, Spawned],
    timeout_s: float,
    say: Callable[[str], None],
    relaunch: Callable[[dict], Spawned] | None = None,
) -> None:
    """Until every member is ready. A tritonserver killed by a signal while loading (tritonserver 2.51's stub
    can abort its server then: docs/reliability.md) is started once more, its first log kept beside."""
    started = time.monotonic()
    pending = list(pending)
    relaunched: set[str] = set()
    while pending:
        for member in list(pending):
            code = spawned[member.name].process.poll()
            if (
                code is not None
                and code < 0
                and relaunch
                and not member.is_llm
                and member.name not in relaunched
            ):
                relaunched.add(member.name)
                stop(member.ref, grace_s=5.0, whole_group=True)  # its stubs
                failed_log = Path(f"{member.entry['log']}.failed")
                Path(member.entry["log"]).replace(failed_log)
                dead_servers_watchdog = watchdog_log(member.entry)
                if dead_servers_watchdog.exists():  # it writes on there, sweeping the dead stubs' pools
                    dead_servers_watchdog.replace(f"{failed_log}.watchdog")
                say(
                    f"{member.name} was killed by signal {-code} while loading; starting it again (log: {failed_log})"
                )
                relaunch(member.entry)
                continue
            if code is not None:
                raise LaunchError(
                    f"{member.name} exited with code {code} before it was ready\n{log_tail(member.entry['log'])}"
                )
            if member.ready():
                say(f"{member.name} ready after {time.monotonic() - started:.1f} s: {member.where()}")
                pending.remove(member)
        if pending and time.monotonic() - started > timeout_s:
            tails = "\n".join(log_tail(m.entry["log"]) for m in pending)
            names = ", ".join(m.name for m in pending)
            raise LaunchError(f"not ready after {timeout_s:.0f} s: {names}\n{tails}")
        if pending:
            time.sleep(POLL_S)


def status(state_file: Path) -> tuple[int, list[str]]:
    """(0 all running and ready | 1 some down or not ready | 3 nothing runs, lines describing each process)."""
    state = read_state(state_file)
    if state is None:
        return EXIT_NOT_RUNNING, [f"no servers ({state_file} does not exist)"]
    lines, alive, ready = [], 0, 0
    for member in members(state):
        is_alive = member.ref.alive()
        is_ready_now = is_alive and member.ready()
        alive += is_alive
        ready += is_ready_now
        word = "ready" if is_ready_now else "running, not ready" if is_alive else "not running"
        lines.append(f"{member.name} (pid {member.entry['pid']}): {word}; {member.where()}")
    if alive == 0:
        return EXIT_NOT_RUNNING, lines
    return (0 if ready == len(lines) else EXIT_DEGRADED), lines


def stop_all(state_file: Path, grace_s: float = 40.0, say: Callable[[str], None] = print) -> int:
    """Stop every process of the state file (token2wav servers first), remove it; returns how many ran."""
    state = read_state(state_file)
    if state is None:
        say(f"no servers ({state_file} does not exist)")
        return 0
    everyone = members(state)
    servers = [m for m in everyone if not m.is_llm]
    stopped = _stop_members(servers, grace_s) + _stop_members([m for m in everyone if m.is_llm], grace_s)
    _remove_files(state)
    Path(state_file).unlink(missing_ok=True)
    say(f"stopped {stopped} of {len(everyone)} server processes ({state_file})")
    return stopped


def _stop_members(group: list[Member], grace_s: float = 10.0) -> int:
    if not group:
        return 0
    with ThreadPoolExecutor(max_workers=len(group)) as pool:
        done = pool.map(lambda m: stop(m.ref, grace_s, whole_group=m.is_llm), group)
        return sum(done)


def _remove_files(state: dict) -> None:
    for entry in [state["llm"], *state["servers"]]:
        if entry is not None:
            Path(entry["pid_file"]).unlink(missing_ok=True)
