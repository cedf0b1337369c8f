"""A run spread over several Triton servers (disaggregated serving): its requests and latencies by server.

Worker i of a run sends to server i mod n, so each server has `concurrent_tasks` workers. The markdown table
follows upstream's disaggregated one; `concurrent_tasks_per_gpu` is the run's workers over the GPUs of the
deployment (the LLM's included), when that count is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tritontts.bench.stats import BenchmarkRun, LatencyStats, summarize

ALL = "all"
COLUMNS = (
    "server",
    "concurrent_tasks_per_server",
    "concurrent_tasks_per_gpu",
    "requests",
    "failed",
    "first chunk avg (ms)",
    "first chunk p50 (ms)",
    "latency avg (ms)",
    "latency p50 (ms)",
)


def parse_servers(text: str) -> list[str]:
    """`host:port,host:port` as a list; ValueError naming the entry that is not host:port."""
    servers = [s.strip() for s in text.split(",") if s.strip()]
    if not servers:
        raise ValueError("--server-addrs needs at least one host:port")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--server-addrs: '{server}' is not host:port")
    return servers


def server_of_worker(servers: Sequence[str], worker: int) -> str:
    return servers[worker % len(servers)]


def tasks_by_server(servers: Sequence[str], workers: int) -> dict[str, int]:
    counts = dict.fromkeys(servers, 0)
    for worker in range(workers):
        counts[server_of_worker(servers, worker)] += 1
    return counts


def _stat(stats: LatencyStats | None, name: str) -> float | None:
    return None if stats is None else getattr(stats, name)


def _row(server: str, run: BenchmarkRun, tasks: float, per_gpu: float | None) -> dict:
    summary = summarize(run)
    return {
        "server": server,
        "concurrent_tasks_per_server": tasks,
        "concurrent_tasks_per_gpu": per_gpu,
        "requests": summary.requests,
        "failed": summary.failed,
        "first_chunk_latency": {
            "avg": _stat(summary.first_chunk_latency, "avg"),
            "p50": _stat(summary.first_chunk_latency, "p50"),
        },
        "latency": {"avg": _stat(summary.latency, "avg"), "p50": _stat(summary.latency, "p50")},
    }


def server_rows(
    run: BenchmarkRun,
    record_servers: Mapping[str, str],
    servers: Sequence[str],
    num_gpus: int | None = None,
) -> list[dict]:
    """One row per server (requests by `record_servers`, record id → server), then the run's as `all`."""
    tasks = tasks_by_server(servers, run.concurrency)
    rows = []
    for server in servers:
        records = [r for r in run.records if record_servers.get(r.id) == server]
        rows.append(
            _row(
                server, BenchmarkRun(run.mode, tasks[server], run.wall_seconds, records), tasks[server], None
            )
        )
    per_gpu = run.concurrency / num_gpus if num_gpus else None
    rows.append(_row(ALL, run, run.concurrency / len(servers), per_gpu))
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.2f}"


def _tasks(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def server_table(rows: Sequence[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        cells = (
            row["server"],
            _tasks(row["concurrent_tasks_per_server"]),
            _tasks(row["concurrent_tasks_per_gpu"]),
            str(row["requests"]),
            str(row["failed"]),
            _ms(row["first_chunk_latency"]["avg"]),
            _ms(row["first_chunk_latency"]["p50"]),
            _ms(row["latency"]["avg"]),
            _ms(row["latency"]["p50"]),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
