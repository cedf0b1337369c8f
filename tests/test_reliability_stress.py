"""Scenario 8 of the reliability suite: streaming under sustained load, the regression test of the stub race.

What must hold: Spark-TTS streaming at concurrency 4 for `TRITONTTS_SOAK_STRESS_SECONDS` (CI: 20 s;
scripts/soak.py: 300 s): every stream completes, no python-backend stub of the served models dies or is
replaced (the same stub processes before and after), and the server log of the run shows no segmentation fault,
no heap-corruption abort and no "not healthy" stub. Before the BLS held a finished LLM stream's objects until the
stub was done with them, the wheel's r24.10 stub freed them on its own thread without the GIL and crashed a BLS
stub in 2 of 3 such 300 s runs on a 2-core CPU (README, "Reliability").
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from reliability_models import (
    SPARK_MODELS,
    SPARK_STREAM,
    build_reliability_models,
    knob,
    loaded,
    percentiles,
    read_outcome,
    record,
    reference_fixture,
    spark_arrays,
)
from triton_stream import Stream

from tritontts.triton.stubs import list_stubs

TRITON_MODELS = [build_reliability_models]
pytestmark = pytest.mark.reliability
CONCURRENCY = 4
CRASH_LINES = re.compile(r"Segmentation fault|not healthy|malloc|double free|corrupted|Aborted")


server = loaded(*SPARK_MODELS)


reference = reference_fixture()


def test_streams_at_concurrency_4_complete_and_no_stub_dies(server, reference):
    seconds = knob("stress_seconds", 20)
    arrays = spark_arrays(reference)
    log = server.server.config.log_file
    log_start = log.stat().st_size
    before = {s.instance: s.pid for s in list_stubs(server.server.pid)}
    outcomes: list[tuple[str, str, float]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def worker(_: int) -> None:
        while time.monotonic() - start < seconds:
            began = time.monotonic()
            outcome, message = read_outcome(Stream(server.grpc_url, SPARK_STREAM, arrays, ["waveform"]), 120)
            with lock:
                outcomes.append((outcome, message, time.monotonic() - began))

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(worker, range(CONCURRENCY)))
    elapsed = time.monotonic() - start
    after = {s.instance: s.pid for s in list_stubs(server.server.pid)}
    with open(log, "rb") as text:
        text.seek(log_start)
        crash_lines = [
            line for line in text.read().decode(errors="replace").splitlines() if CRASH_LINES.search(line)
        ]
    replaced = sorted(name for name, pid in before.items() if after.get(name) != pid)
    failed = [o for o in outcomes if o[0] != "ok"]
    record(
        "stress_streaming",
        seconds=round(elapsed, 1),
        concurrency=CONCURRENCY,
        streams=len(outcomes),
        failed=len(failed),
        streams_per_s=round(len(outcomes) / elapsed, 2),
        latency_s=percentiles([o[2] for o in outcomes]),
        stubs=len(before),
        stubs_replaced=replaced,
        crash_lines=crash_lines[:20],
    )
    assert failed == [], failed[:5]
    assert replaced == [], f"stubs died or were replaced during the run: {replaced}"
    assert crash_lines == [], crash_lines[:5]
    assert len(outcomes) >= CONCURRENCY
