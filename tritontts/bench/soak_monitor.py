"""The GPU soak's process monitor (scripts/soak_traffic.py): every tritonserver and python-backend stub on the
host, found by /proc cmdline, their resident memory, their GPU memory from nvidia-smi, and the stubs that die.

A stub is named `stub:<server pid>:<instance>` (its model instance, e.g. spark_tts_0_1, from its command line;
tritontts.triton.stubs reads it); a server `tritonserver:<pid>`. A stub death is a stub pid that is gone while its
server lives (Triton restarting it gives the instance a new pid). Server logs are scanned for the lines of a stub
that died or crashed (`scan_log`).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tritontts.processes import process_argv
from tritontts.triton.stubs import list_stubs

SERVER_BINARY = "tritonserver"
FAULTS = {
    "stub_not_healthy": re.compile(r"Stub process .* is not healthy"),
    "segmentation_fault": re.compile(r"Segmentation fault"),
    "signal": re.compile(r"Signal \(\d+\) received"),
}
UNLOAD_FAULTS = {
    **FAULTS,
    # the stop's own SIGTERM or SIGINT is no fault; tritonserver exiting before every model unloaded is one
    "signal": re.compile(r"Signal \((?!(?:2|15)\))\d+\) received"),
    "exit_timeout": re.compile(r"Exit timeout expired"),
}


def rss_bytes(pid: int) -> int | None:
    """VmRSS of `pid`, None when gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def find_servers() -> list[int]:
    """The pids of every tritonserver process on the host."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            argv = process_argv(int(entry))
            if argv and os.path.basename(argv[0]) == SERVER_BINARY:
                pids.append(int(entry))
    return sorted(pids)


def nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


def gpu_memory(smi: str | None) -> tuple[dict[int, float], float | None]:
    """(GPU MiB by pid, total MiB used on the GPUs) from nvidia-smi; ({}, None) without it or when it fails."""
    if smi is None:
        return {}, None

    def query(what: str) -> str:
        done = subprocess.run(
            [smi, what, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    try:
        apps = query("--query-compute-apps=pid,used_memory")
        used = query("--query-gpu=memory.used")
    except (OSError, subprocess.SubprocessError):
        return {}, None
    by_pid: dict[int, float] = {}
    for line in apps.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                by_pid[int(parts[0])] = by_pid.get(int(parts[0]), 0.0) + float(parts[1])
            except ValueError:
                pass
    total = [float(x) for x in used.split() if x.replace(".", "", 1).isdigit()]
    return by_pid, (sum(total) if total else None)


def gpu_name() -> str | None:
    smi = nvidia_smi()
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names) or None


def scan_log(path: Path, offset: int = 0, faults: dict[str, re.Pattern] = FAULTS) -> dict:
    """Counts of `faults`' lines in the log `path` from byte `offset`, its size now, and the first such lines
    (UNLOAD_FAULTS for the lines a stop wrote)."""
    counts = dict.fromkeys(faults, 0)
    lines: list[str] = []
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            data = log.read()
    except OSError as err:
        return {"path": str(path), "error": str(err), "counts": counts, "size": None, "lines": []}
    for line in data.decode(errors="replace").splitlines():
        for name, pattern in faults.items():
            if pattern.search(line):
                counts[name] += 1
                if len(lines) < 20:
                    lines.append(line[:300])
    return {
        "path": str(path),
        "from_byte": offset,
        "size": offset + len(data),
        "counts": counts,
        "lines": lines,
    }


@dataclass
class Sample:
    t: float  # time.monotonic()
    rss: dict[str, int]
    gpu: dict[str, float]
    gpu_total: float | None


@dataclass
class Monitor:
    """Samples the servers `server_pids` (None: every tritonserver on the host, found anew at every sample) and
    their stubs."""

    server_pids: list[int] | None = None
    smi: str | None = field(default_factory=nvidia_smi)
    stubs: dict[tuple[int, str], int] = field(default_factory=dict)  # (server, instance) -> current stub pid
    processes: dict[str, dict] = field(default_factory=dict)  # label -> pid, model, first/last seen
    deaths: list[dict] = field(default_factory=list)
    server_exits: list[dict] = field(default_factory=list)
    samples: int = 0
    _servers_seen: set[int] = field(default_factory=set)
    _digests: dict[tuple[int, int], str] = field(default_factory=dict)

    def _digest(self, pid: int) -> str | None:
        """The first 16 hex digits of the sha256 of the file `pid` executes (/proc/<pid>/exe: the file it
        started from, even when replaced since), cached by inode."""
        try:
            stat = os.stat(f"/proc/{pid}/exe")
            key = (stat.st_dev, stat.st_ino)
            if key not in self._digests:
                with open(f"/proc/{pid}/exe", "rb") as exe:
                    self._digests[key] = hashlib.file_digest(exe, "sha256").hexdigest()[:16]
            return self._digests[key]
        except (OSError, AttributeError):  # AttributeError: hashlib.file_digest is Python 3.11+
            return None

    def _note(self, label: str, pid: int, model: str, now: float) -> None:
        entry = self.processes.get(label)
        if entry is None:
            entry = self.processes[label] = {
                "pid": pid,
                "model": model,
                "binary": (process_argv(pid) or [""])[0],
                "sha256": self._digest(
                    pid
                ),  # which stub ran: run.sh copies the chosen one over the same path
                "pids": [],
                "first_seen": now,
            }
        if pid not in entry["pids"]:
            entry["pids"].append(pid)
        entry["pid"], entry["last_seen"] = pid, now

    def sample(self) -> Sample:
        now = time.monotonic()
        servers = (
            find_servers()
            if self.server_pids is None
            else [p for p in self.server_pids if rss_bytes(p) is not None]
        )
        for gone in sorted(self._servers_seen - set(servers)):
            self.server_exits.append({"t": now, "server": gone})
        self._servers_seen = (self._servers_seen & set(servers)) | set(servers)
        rss: dict[str, int] = {}
        label_of: dict[int, str] = {}
        for server in servers:
            value = rss_bytes(server)
            if value is None:
                continue
            label = f"tritonserver:{server}"
            rss[label], label_of[server] = value, label
            self._note(label, server, "", now)
            live = {}
            for stub in list_stubs(server):
                live[stub.instance] = stub  # the newest of an instance name last
            for instance, stub in live.items():
                key = (server, instance)
                previous = self.stubs.get(key)
                if previous is not None and previous != stub.pid:
                    self.deaths.append(
                        {
                            "t": now,
                            "server": server,
                            "instance": instance,
                            "pid": previous,
                            "new_pid": stub.pid,
                        }
                    )
                self.stubs[key] = stub.pid
                value = rss_bytes(stub.pid)
                if value is not None:
                    label = f"stub:{server}:{instance}"
                    rss[label], label_of[stub.pid] = value, label
                    self._note(label, stub.pid, stub.model, now)
            for key in [k for k in self.stubs if k[0] == server and k[1] not in live]:
                self.deaths.append(
                    {
                        "t": now,
                        "server": server,
                        "instance": key[1],
                        "pid": self.stubs.pop(key),
                        "new_pid": None,
                    }
                )
        by_pid, total = gpu_memory(self.smi)
        gpu = {label_of.get(pid, f"pid:{pid}"): mib for pid, mib in by_pid.items()}
        self.samples += 1
        return Sample(now, rss, gpu, total)

    def report(self) -> dict:
        return {
            "samples": self.samples,
            "nvidia_smi": self.smi,
            "processes": self.processes,
            "stub_deaths": len(self.deaths),
            "stub_death_events": self.deaths[:200],
            "server_exits": self.server_exits,
        }
