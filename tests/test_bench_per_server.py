"""A run's requests and latencies by server (client_grpc.py --server-addrs)."""

from __future__ import annotations

import pytest

from tritontts.bench.per_server import (
    parse_servers,
    server_of_worker,
    server_rows,
    server_table,
    tasks_by_server,
)
from tritontts.bench.stats import BenchmarkRun, RequestRecord

A, B = "h:1", "h:2"


def test_parse_servers():
    assert parse_servers(" h:1, h:2 ,") == [A, B]
    with pytest.raises(ValueError, match="'h' is not host:port"):
        parse_servers("h:1,h")
    with pytest.raises(ValueError, match="at least one"):
        parse_servers(" , ")


def test_workers_go_round_robin():
    assert [server_of_worker([A, B], w) for w in range(5)] == [A, B, A, B, A]
    assert tasks_by_server([A, B], 3) == {A: 2, B: 1}
    assert tasks_by_server([A, B], 1) == {A: 1, B: 0}


def test_rows_by_server_then_all():
    records = [
        RequestRecord("r0", 1.0, 2.0, first_chunk_latency=0.1, chunks=3),
        RequestRecord("r1", 3.0, 2.0, first_chunk_latency=0.3, chunks=3),
        RequestRecord("r2", 0.0, error="boom"),
    ]
    run = BenchmarkRun("streaming", 2, 5.0, records)
    rows = server_rows(run, {"r0": A, "r1": B, "r2": B}, [A, B], num_gpus=3)
    assert [(r["server"], r["requests"], r["failed"]) for r in rows] == [(A, 1, 0), (B, 2, 1), ("all", 3, 1)]
    assert rows[1]["first_chunk_latency"] == {"avg": pytest.approx(0.3), "p50": pytest.approx(0.3)}
    assert rows[2]["latency"] == {"avg": pytest.approx(2.0), "p50": pytest.approx(2.0)}
    assert [r["concurrent_tasks_per_server"] for r in rows] == [1, 1, 1.0]
    assert [r["concurrent_tasks_per_gpu"] for r in rows] == [None, None, pytest.approx(2 / 3)]
    table = server_table(rows).splitlines()
    assert table[0].startswith("| server | concurrent_tasks_per_server | concurrent_tasks_per_gpu |")
    assert table[2] == "| h:1 | 1.00 | - | 1 | 0 | 100.00 | 100.00 | 1000.00 | 1000.00 |"
    assert table[4].startswith("| all | 1.00 | 0.67 | 3 | 1 |")


def test_server_without_requests_has_no_latencies():
    run = BenchmarkRun("offline", 1, 1.0, [RequestRecord("r0", 1.0, 1.0)])
    rows = server_rows(run, {"r0": A}, [A, B])
    assert rows[1]["requests"] == 0 and rows[1]["latency"] == {"avg": None, "p50": None}
    assert "| h:2 | 0.00 | - | 0 | 0 | - | - | - | - |" in server_table(rows)
