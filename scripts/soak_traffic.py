#!/usr/bin/env python3
"""GPU soak (issue 38 item 4): mixed speech-API traffic on running servers, with every tritonserver's and stub's
memory and the stub deaths watched over time.

    python scripts/soak_traffic.py --target spark=http://127.0.0.1:8080,spark-tts \\
        --target cosy2=http://127.0.0.1:8081,cosyvoice2 --reference-wav ref.wav --reference-text "..." \\
        --concurrency 16 --seconds 900 --window 60 --server-log exp/soak_spark/spark_tts/tritonserver.log \\
        --output soak/wheel_stub.json --detach
    python scripts/soak_traffic.py --status --output soak/wheel_stub.json
    bash run.sh stop ...    # then, with the servers stopped:
    python scripts/soak_traffic.py --after-stop --output soak/wheel_stub.json --server-log ...

Each worker of `--concurrency` goes round-robin over every target and request kind (tritontts.bench.soak_load):
streams with the saved `--voice`, streams with a new voice (the reference in the request), whole files, streams
closed after their first chunk. tritontts.bench.soak_monitor samples every tritonserver and python-backend stub
on the host every `--sample-every` s (resident memory, GPU memory from nvidia-smi, stub pids that change or
vanish); the JSON at `--output` holds the meta, the per-window series, the totals and the verdicts against the
targets (0 errors, 0 stub deaths, GPU memory flat, first-chunk p99 flat; tritontts.bench.soak_windows) and is
rewritten after every window. `--detach` runs in a new session (log `<output>.log`, status `<output>.status.json`)
and returns; `--status` prints a run's progress; `--after-stop` scans the server logs again after the servers
stopped and judges "no fault at unload".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tritontts.bench.soak_load import Target, Voices, read_reference, run_load
from tritontts.bench.soak_monitor import UNLOAD_FAULTS, Monitor, gpu_name, scan_log
from tritontts.bench.soak_windows import KINDS, Windows, totals_and_verdicts
from tritontts.processes import pid_alive

ROOT = Path(__file__).resolve().parents[1]


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--target", action="append", default=[], help="NAME=URL[,MODEL] of a speech API (repeatable)"
    )
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight, over all targets")
    p.add_argument("--seconds", type=float, default=900, help="how long new requests start")
    p.add_argument("--window", type=float, default=60, help="seconds per window of the series")
    p.add_argument("--sample-every", type=float, default=5, help="seconds between memory samples")
    p.add_argument("--server-log", action="append", type=Path, default=[], help="a tritonserver log to scan")
    p.add_argument("--server-pid", action="append", type=int, default=[], help="watch only these servers")
    p.add_argument(
        "--voice", default="default", help="the saved voice (added from the reference when missing)"
    )
    p.add_argument("--reference-wav", type=Path, help="the new voice's reference audio (WAV)")
    p.add_argument("--reference-text", help="its transcript")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"request kinds, of {','.join(KINDS)}")
    p.add_argument(
        "--api-key", default=os.environ.get("TRITONTTS_API_KEY"), help="default: $TRITONTTS_API_KEY"
    )
    p.add_argument("--request-timeout", type=float, default=300)
    p.add_argument("--wait-ready", type=float, default=300, help="seconds to wait for each API's /health")
    p.add_argument("--no-warmup", action="store_true", help="skip one untimed request per target and kind")
    p.add_argument("--memory-tolerance", type=float, default=0.05, help="flat memory: growth at most this")
    p.add_argument(
        "--p99-tolerance", type=float, default=0.25, help="flat first-chunk p99: growth at most this"
    )
    p.add_argument("--label", default="", help="free text for the meta, e.g. 'r24.12 stub'")
    p.add_argument("--output", type=Path, default=Path("soak_traffic.json"))
    p.add_argument("--status-file", type=Path, help="default: <output>.status.json")
    p.add_argument("--detach", action="store_true", help="run in a new session (log <output>.log) and return")
    p.add_argument("--status", action="store_true", help="print the progress of a (detached) run and exit")
    p.add_argument(
        "--after-stop", action="store_true", help="scan --server-log again once the servers stopped"
    )
    return p


def status_path(args) -> Path:
    return args.status_file or args.output.with_name(args.output.name + ".status.json")


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    tmp.replace(path)


def meta(args, argv: list[str]) -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        )
    except OSError:
        commit, dirty = "", None
    return {
        "device": gpu_name() or f"CPU: {cpu}",
        "cpu": cpu,
        "cores": os.cpu_count(),
        "label": args.label,
        "command": "python scripts/soak_traffic.py " + shlex.join(argv),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit or None,
        "dirty": dirty,
        "python": platform.python_version(),
        "settings": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("api_key", "detach", "status", "after_stop")
        },
    }


async def soak(args, argv: list[str]) -> dict:
    targets = [Target.parse(spec) for spec in args.target]
    kinds = tuple(k for k in args.kinds.split(",") if k)
    voices = Voices(args.voice, read_reference(args.reference_wav), args.reference_text)
    windows, monitor = Windows(args.window, args.seconds), Monitor(server_pids=args.server_pid or None)
    logs_at_start = {str(log): scan_log(log)["size"] or 0 for log in args.server_log}
    out = {"meta": meta(args, argv), "targets": [], "load": {}}
    began, t0 = time.monotonic(), None
    status = {"pid": os.getpid(), "state": "starting", "output": str(args.output), "seconds": args.seconds}

    def report(final: bool) -> dict:
        series = windows.series()
        scans = [scan_log(Path(log), offset) for log, offset in logs_at_start.items()]
        faults = sum(sum(s["counts"].values()) for s in scans)
        errors = windows.totals["errors"] + out["load"].get("warmup_errors", 0)
        totals, verdicts = totals_and_verdicts(
            series, errors, len(monitor.deaths), faults, args.memory_tolerance, args.p99_tolerance
        )
        totals |= {k: v for k, v in windows.totals.items() if k != "errors"} | {
            "warmup_errors": out["load"].get("warmup_errors", 0)
        }
        return out | {
            "finished": final,
            "series": series,
            "totals": totals,
            "verdicts": verdicts,
            "monitor": monitor.report(),
            "server_logs": scans,
            "rows": windows.rows(),
        }

    def write_status(state: str) -> None:
        status.update(
            state=state,
            elapsed_s=round(time.monotonic() - (t0 or began), 1),
            loading=t0 is not None,
            requests=windows.totals["requests"],
            errors=windows.totals["errors"],
            cancelled=windows.totals["cancelled"],
            windows=len(windows.windows),
            last_window_p99_ms=windows.last_p99(),
            stub_deaths=len(monitor.deaths),
            updated_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        write_json(status_path(args), status)

    def started(at: float) -> None:
        nonlocal t0
        t0 = at

    async def watch(stop: asyncio.Event) -> None:
        written = -1
        while True:
            sample = await asyncio.to_thread(monitor.sample)
            if t0 is not None:
                windows.add_sample(sample.t - t0, sample.rss, sample.gpu, sample.gpu_total)
                current = int((time.monotonic() - t0) // args.window)
                if current != written:  # a window closed: the JSON so far, should the run be cut short
                    written = current
                    write_json(args.output, await asyncio.to_thread(report, False))
            write_status("running")
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), args.sample_every)
            except asyncio.TimeoutError:
                pass

    write_status("starting")
    stop = asyncio.Event()
    watcher = asyncio.create_task(watch(stop))
    try:
        out["load"] = await run_load(
            targets,
            voices,
            args.concurrency,
            args.seconds,
            windows.add,
            args.api_key,
            args.request_timeout,
            not args.no_warmup,
            kinds,
            started,
            args.wait_ready,
        )
    except BaseException:
        stop.set()
        await watcher
        write_status("failed")
        raise
    finally:
        stop.set()
        await watcher
    out["targets"] = [
        {"name": t.name, "url": t.url, "model": t.model, "sample_rate": t.sample_rate} for t in targets
    ]
    out["meta"]["wall_s"] = round(time.monotonic() - began, 1)
    result = report(True)
    write_json(args.output, result)
    write_status("done")
    return result


def print_status(args) -> int:
    path = status_path(args)
    if not path.exists():
        print(f"no status file {path}", file=sys.stderr)
        return 1
    s = json.loads(path.read_text())
    state = s["state"]
    if state in ("starting", "running") and not pid_alive(s["pid"]):
        state = "died (its pid is gone; see the log)"
    print(
        f"state: {state} (pid {s['pid']}), elapsed {s.get('elapsed_s')} of {s['seconds']} s, requests {s.get('requests')}, "
        f"errors {s.get('errors')}, cancelled {s.get('cancelled')}, windows {s.get('windows')}, "
        f"last window's first-chunk p99 {s.get('last_window_p99_ms')} ms, stub deaths {s.get('stub_deaths')}; "
        f"output {s['output']}"
    )
    return 0


def after_stop(args) -> int:
    """Scan the server logs from where the run left them: faults while the servers stopped (unload)."""
    result = json.loads(args.output.read_text())
    ends = {s["path"]: s.get("size") or 0 for s in result.get("server_logs", [])}
    scans = [scan_log(log, ends.get(str(log), 0), UNLOAD_FAULTS) for log in args.server_log]
    faults = sum(sum(s["counts"].values()) for s in scans)
    result["unload"] = {"server_logs": scans, "faults": faults}
    result["verdicts"]["no_fault_at_unload"] = faults == 0 if scans else None
    write_json(args.output, result)
    print(f"faults at unload: {faults}; verdicts: {json.dumps(result['verdicts'])}")
    return 0


def detach(args, argv: list[str], wait_s: float = 30) -> int:
    log = args.output.with_name(args.output.name + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    status_path(args).unlink(missing_ok=True)
    child = [sys.executable, str(Path(__file__).resolve()), *(a for a in argv if a != "--detach")]
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"=== {time.strftime('%F %T')} detached: {shlex.join(child)}\n")
        out.flush()
        process = subprocess.Popen(
            child,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    end = time.monotonic() + wait_s
    while time.monotonic() < end and process.poll() is None and not status_path(args).exists():
        time.sleep(0.2)
    if process.poll() is not None and process.returncode != 0:
        print(f"the soak ended at once (exit {process.returncode}); log {log}", file=sys.stderr)
        return 1
    print(f"soak running in the background (pid {process.pid}); log {log}; status {status_path(args)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = get_parser().parse_args(argv)
    if args.status:
        return print_status(args)
    if args.after_stop:
        return after_stop(args)
    if not args.target:
        print("error: give at least one --target NAME=URL[,MODEL]", file=sys.stderr)
        return 2
    if args.detach:
        return detach(args, argv)
    try:
        result = asyncio.run(soak(args, argv))
    except (
        RuntimeError,
        ValueError,
        OSError,
    ) as err:  # a target not ready, a missing reference: no traceback
        print(f"error: {err}", file=sys.stderr)
        return 1
    t = result["totals"]
    print(
        f"requests {t['requests']}, errors {t['errors']}, cancelled {t['cancelled']}, stub deaths {t['stub_deaths']}; "
        f"verdicts {json.dumps(result['verdicts'])}; output {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
