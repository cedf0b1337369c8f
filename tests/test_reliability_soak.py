"""Scenario 5 of the reliability suite: soak.

What must hold: mixed offline and streaming traffic at concurrency 8 (Spark-TTS streaming and offline, CosyVoice2
streaming) for `TRITONTTS_SOAK_SECONDS` (CI: 30 s; scripts/soak.py: 30 min and more): zero errors, and the
resident memory of tritonserver and of every stub, sampled every 2 s, grows by at most 5% after warm-up (the
first third). Latencies go to the soak report, not into assertions.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cosyvoice2_models import build_cosyvoice2_models
from reliability_models import (
    COSY_MODELS,
    COSY_STREAM,
    SPARK_MODELS,
    SPARK_OFFLINE,
    SPARK_STREAM,
    build_reliability_cosyvoice2_models,
    build_reliability_models,
    knob,
    loaded,
    percentiles,
    read_outcome,
    record,
    reference_clip,
    rss_bytes,
    spark_arrays,
)
from triton_stream import Stream, make_inputs
from tritonclient.utils import InferenceServerException

TRITON_MODELS = [build_reliability_models, build_cosyvoice2_models, build_reliability_cosyvoice2_models]
pytestmark = pytest.mark.reliability
CONCURRENCY = 8
GROWTH = 0.05
SAMPLE_S = 2.0


server = loaded(*SPARK_MODELS, *COSY_MODELS)


def test_mixed_traffic_at_concurrency_8_has_no_errors_and_flat_memory(server, prompt_zh):
    seconds = knob("seconds", 30)
    arrays = spark_arrays(reference_clip(prompt_zh))
    kinds = itertools.cycle([(SPARK_STREAM, "stream"), (SPARK_OFFLINE, "offline"), (COSY_STREAM, "stream")])
    for model, kind in [next(kinds) for _ in range(3)]:  # warm every path up before the clock starts
        assert one_request(server, model, kind, arrays)[0] == "ok"
    samples: list[tuple[float, dict[str, int]]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((time.monotonic(), rss_bytes(server.server.pid)))
            stop.wait(SAMPLE_S)

    results: list[tuple[str, str, str, float]] = []
    lock = threading.Lock()
    start = time.monotonic()

    def worker(index: int):
        plan = itertools.islice(
            itertools.cycle([(SPARK_STREAM, "stream"), (SPARK_OFFLINE, "offline"), (COSY_STREAM, "stream")]),
            index,
            None,
        )
        while time.monotonic() - start < seconds:
            model, kind = next(plan)
            began = time.monotonic()
            outcome, message = one_request(server, model, kind, arrays)
            with lock:
                results.append((model, outcome, message, time.monotonic() - began))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(worker, range(CONCURRENCY)))
    stop.set()
    sampler.join()
    errors = [r for r in results if r[1] != "ok"]
    growth = memory_growth(samples, start + seconds / 3)
    record(
        "soak",
        seconds=round(time.monotonic() - start, 1),
        concurrency=CONCURRENCY,
        requests=len(results),
        errors=len(errors),
        latency_s={
            m: percentiles([r[3] for r in results if r[0] == m])
            for m in (SPARK_STREAM, SPARK_OFFLINE, COSY_STREAM)
        },
        rss_samples=len(samples),
        rss_growth_after_warmup={k: round(v, 4) for k, v in growth.items()},
        rss_mib_end={k: round(v / 2**20, 1) for k, v in samples[-1][1].items()},
    )
    assert errors == [], errors[:10]
    assert len(results) >= CONCURRENCY
    grown = {k: v for k, v in growth.items() if v > GROWTH}
    assert grown == {}, f"resident memory grew by more than {GROWTH:.0%} after warm-up: {grown}"


def one_request(server, model: str, kind: str, arrays: dict) -> tuple[str, str]:
    if kind == "stream":
        return read_outcome(Stream(server.grpc_url, model, arrays, ["waveform"]), 300)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        audio = client.infer(model, make_inputs(arrays), client_timeout=300).as_numpy("waveform")
        return (
            ("ok", "") if audio is not None and np.isfinite(audio).all() else ("error", "no finite waveform")
        )
    except InferenceServerException as err:
        return "error", str(err)
    finally:
        client.close()


def memory_growth(samples: list[tuple[float, dict[str, int]]], warm: float) -> dict[str, float]:
    """Per process: the mean of the last three samples over the first sample after warm-up, minus 1."""
    after = [rss for t, rss in samples if t >= warm]
    if len(after) < 2:
        after = [rss for _, rss in samples[-2:]]
    level, end = after[0], after[-3:]
    return {
        name: float(np.mean([s[name] for s in end])) / level[name] - 1.0
        for name in level
        if level[name] and all(name in s for s in end)
    }
