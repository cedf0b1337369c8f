"""A watchdog beside tritonserver: a python-backend stub that died is never restarted by tritonserver 2.51.

What 2.51 does (docs/reliability.md): after `kill -9` of a stub every later request routed to that instance
fails with "Stub process '<instance>' is not healthy", for ever, and the model and the server stay ready. So
this watchdog polls the server's stubs; when an instance of a ready model has had no live stub for `grace_s`,
it reloads the model through the model-control API (explicit mode: new stubs, the next requests succeed) and,
where that is refused or fails, stops the server with SIGTERM: its readiness turns false at once and it exits,
for an orchestrator (Kubernetes, systemd, run.sh's caller) to start it again. A dead stub's shared-memory pool
stays mapped by tritonserver when requests were in flight on it, and 2.51 leaves it in /dev/shm after it exits:
the watchdog removes it once nothing maps it (it outlives the server for that last sweep).

    python -m tritontts.triton.watchdog --server-pid PID --http-url 127.0.0.1:8000 [--action auto|reload|exit]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritontts.triton.server import answers_ok, is_tritonserver
from tritontts.triton.stubs import Stub, free_shm_region, is_alive, list_stubs, stub_started

log = logging.getLogger("tritontts.watchdog")
ACTIONS = ("auto", "reload", "exit")
KILLED_EXIT_S = 15.0
"""how long the last sweep waits for the stubs it killed to be gone and their pools unmapped"""


@dataclass
class WatchdogConfig:
    server_pid: int
    http_url: str  # host:port of the server's HTTP endpoint
    action: str = "auto"  # auto: reload, else exit | reload only | exit only
    grace_s: float = 2.0
    poll_s: float = 1.0


@dataclass
class Watchdog:
    config: WatchdogConfig
    known: dict[int, Stub] = field(default_factory=dict)  # pid -> a stub seen alive
    missing_since: dict[int, float] = field(default_factory=dict)  # pid of a stub gone -> when noticed
    loading: dict[int, Stub] = field(default_factory=dict)  # pid -> a model's load-time stub seen, until gone
    dead_regions: list[str] = field(default_factory=list)  # shm pools of dead stubs, removed once unmapped
    events: list[dict] = field(default_factory=list)
    clock: Callable[[], float] = time.monotonic

    def model_ready(self, model: str) -> bool:
        return answers_ok(f"http://{self.config.http_url}/v2/models/{model}/ready")

    def instance_stubs(self) -> list[Stub]:
        """The server's live stubs of model instances, not a model's own load-time stub (Stub.runs_an_instance)."""
        return [s for s in list_stubs(self.config.server_pid) if s.runs_an_instance]

    def check(self) -> list[str]:
        """One poll: the models found dead (and acted upon) in it.

        Only instance stubs are followed (instance_stubs), by pid: after a reload, 2.51 may keep an old version's
        stub alive beside the new one of the same instance name (docs/reliability.md), so a name alone would hide a
        new stub's death."""
        now = self.clock()
        every_stub = list_stubs(self.config.server_pid)
        stubs = [s for s in every_stub if s.runs_an_instance]
        self._follow_load_time_stubs(every_stub)
        live = {s.pid: s for s in stubs}
        for pid in self.known:
            if pid not in live and pid not in self.missing_since:
                self.missing_since[pid] = now
        dead: dict[str, float] = {}  # model -> when its first stub went missing
        for pid, since in list(self.missing_since.items()):
            stub = self.known[pid]
            replaced = any(s.instance == stub.instance and s.started >= stub.started for s in stubs)
            if replaced or not self.model_ready(stub.model):  # reloaded or unloaded on purpose
                del self.missing_since[pid]
            elif now - since >= self.config.grace_s:
                dead[stub.model] = min(since, dead.get(stub.model, since))
        self.known = {pid: self.known[pid] for pid in self.missing_since} | live
        # in the order their deaths were noticed: a killed callee seen a poll before the BLS that exited waiting
        # on it (CalleeMonitor) comes back first (deaths seen in one poll: by name)
        for model in sorted(dead, key=lambda m: (dead[m], m)):
            self.recover(model)
        self.sweep()
        return sorted(dead)

    def _follow_load_time_stubs(self, every_stub: list[Stub]) -> None:
        """Keep the load-time stubs seen until they are gone and their pools with them: a server that dies while
        a model loads leaves that stub's pool behind too, for the last sweep."""
        alive = {s.pid for s in every_stub}
        self.loading = {
            pid: s
            for pid, s in self.loading.items()
            if pid in alive or (s.shm_region and os.path.exists(f"/dev/shm/{s.shm_region}"))
        }
        for stub in every_stub:
            if not stub.runs_an_instance and stub.pid not in self.loading:
                log.info("model '%s' is loading (its load-time stub: pid %d)", stub.model, stub.pid)
                self.loading[stub.pid] = stub

    def sweep(self) -> None:
        """Remove the pools of dead stubs that nothing maps any more."""
        self.dead_regions = [r for r in self.dead_regions if not self._freed(r)]

    def final_sweep(self, timeout_s: float = 15.0) -> None:
        """After the server exited: remove every pool of its stubs once nothing maps it. A clean exit removes
        them itself, but not those of an old instance 2.51 kept (see check) nor any after a crash or SIGKILL, a
        model's load-time stub's included; the stubs themselves exit a moment after the server."""
        seen = [*self.known.values(), *self.loading.values()]
        self.dead_regions += [s.shm_region for s in seen if s.shm_region]
        self.dead_regions = list(dict.fromkeys(self.dead_regions))
        deadline = self.clock() + timeout_s
        self.sweep()
        while self.dead_regions and self.clock() < deadline:
            time.sleep(0.5)
            self.sweep()
        # a stub blocked sending to a killed caller outlives its server (re-parented, holding its pool)
        killed = []
        for stub in seen:
            if stub_started(stub.pid) == stub.started:
                log.error("stub %s (pid %d) outlived tritonserver: killing it", stub.instance, stub.pid)
                os.kill(stub.pid, signal.SIGKILL)
                killed.append(stub.pid)
        # a killed stub unmaps its pool only once it is gone, which takes seconds on a busy host
        deadline = self.clock() + KILLED_EXIT_S
        self.sweep()
        while (self.dead_regions or any(is_alive(pid) for pid in killed)) and self.clock() < deadline:
            time.sleep(0.5)
            self.sweep()
        for region in self.dead_regions:
            log.error("could not remove /dev/shm/%s, the shared memory of a stub of the server", region)

    def _freed(self, region: str) -> bool:
        if free_shm_region(region):
            log.info("removed /dev/shm/%s, the shared memory of a dead stub", region)
            return True
        return not os.path.exists(f"/dev/shm/{region}")

    def recover(self, model: str) -> None:
        pids = [pid for pid in self.missing_since if self.known[pid].model == model]
        instances = sorted({self.known[pid].instance for pid in pids})
        regions = [self.known[pid].shm_region for pid in pids if self.known[pid].shm_region]
        self.dead_regions += regions
        log.error("model '%s': the stub of %s died; tritonserver does not restart it", model, instances)
        if self.config.action in ("auto", "reload") and self.reload(model):
            self.events.append({"model": model, "instances": instances, "action": "reload", "ok": True})
            for pid in pids:
                self.missing_since.pop(pid, None)
                self.known.pop(pid, None)
            # the new stubs at once: should the server go down before the next poll, their pools are swept too
            self.known |= {s.pid: s for s in self.instance_stubs()}
            self.sweep()
            for region in [r for r in regions if r in self.dead_regions]:
                log.warning(
                    "/dev/shm/%s stays mapped by tritonserver (it keeps the old instance while the requests the "
                    "dead stub held are unanswered); removed once nothing maps it, at the latest when the "
                    "server exits",
                    region,
                )
            return
        if self.config.action == "reload":
            self.events.append({"model": model, "instances": instances, "action": "reload", "ok": False})
            return
        log.error("stopping tritonserver %d so that its readiness turns false", self.config.server_pid)
        self.events.append({"model": model, "instances": instances, "action": "exit", "ok": True})
        if is_tritonserver(self.config.server_pid):
            os.kill(self.config.server_pid, signal.SIGTERM)

    def reload(self, model: str) -> bool:
        """Load the model again with its own config as an override, marked with a `tritontts_reloaded_at`
        parameter: tritonserver skips a load whose files and config did not change, leaving the dead instance in
        place (a plain load, or the same override twice)."""
        base = f"http://{self.config.http_url}/v2"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"{base}/models/{model}/config", timeout=30) as reply:
                config = json.loads(reply.read().decode())
            stamp = {"string_value": f"{time.time():.6f}"}
            config["parameters"] = {**config.get("parameters", {}), "tritontts_reloaded_at": stamp}
            body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
            request = urllib.request.Request(
                f"{base}/repository/models/{model}/load", data=body, method="POST"
            )
            with opener.open(request, timeout=600) as reply:
                ok = reply.status == 200
        except urllib.error.HTTPError as err:
            body = err.read().decode(errors="replace")
            log.error("reloading '%s' was refused (%d): %s", model, err.code, body)
            return False
        except (urllib.error.URLError, OSError) as err:
            log.error("reloading '%s' failed: %s", model, err)
            return False
        log.warning("model '%s' reloaded: new stubs serve it", model)
        return ok


def start_beside(server_pid: int, http_url: str, action: str, log_file: Path) -> int:
    """Start a watchdog process beside the tritonserver `server_pid`, in a session of its own (it outlives the
    server for its last sweep, and a stop that signals the server's group leaves it be), its output appended to
    `log_file`; returns its pid."""
    command = [sys.executable, "-m", "tritontts.triton.watchdog", "--server-pid", str(server_pid)]
    command += ["--http-url", http_url, "--action", action]
    with open(log_file, "ab") as log:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process.pid


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tritontts.triton.watchdog", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--server-pid", type=int, required=True)
    p.add_argument("--http-url", default="127.0.0.1:8000")
    p.add_argument("--action", choices=ACTIONS, default="auto")
    p.add_argument("--grace", type=float, default=2.0, help="seconds an instance may lack a stub")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between checks")
    p.add_argument("--events", default=None, help="append each action as a JSON line to this file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not is_tritonserver(args.server_pid):
        print(f"error: pid {args.server_pid} is not a running tritonserver", file=sys.stderr)
        return 2
    config = WatchdogConfig(args.server_pid, args.http_url, args.action, args.grace, args.poll)
    watchdog = Watchdog(config)
    written = 0
    watchdog.check()
    log.info("watching %d stubs of tritonserver %d", len(watchdog.known), args.server_pid)
    while is_tritonserver(args.server_pid):
        watchdog.check()
        if args.events:
            with open(args.events, "a") as out:
                for event in watchdog.events[written:]:
                    out.write(json.dumps(event) + "\n")
            written = len(watchdog.events)
        time.sleep(config.poll_s)
    watchdog.final_sweep()
    return 0


if __name__ == "__main__":
    sys.exit(main())
