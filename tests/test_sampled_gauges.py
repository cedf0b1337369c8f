"""tritontts.triton.metrics' sampled gauges against a stand-in of pb_utils' metric classes (the real ones are
read from a tritonserver's metrics port in test_cosyvoice2_dit_triton and the reliability suite)."""

from __future__ import annotations

import time
import types

from waiting import wait_until

from tritontts.triton.metrics import EngineGauges, OpenStreamsGauge, release_metrics


class Metric:
    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels
        self.value: float | None = None

    def set(self, value: float) -> None:
        self.value = value


class MetricFamily:
    GAUGE = "gauge"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        self.metrics: list[Metric] = []

    def Metric(self, labels: dict[str, str]) -> Metric:  # noqa: N802 (pb_utils' name)
        metric = Metric(labels)
        self.metrics.append(metric)
        return metric


PB_UTILS = types.SimpleNamespace(MetricFamily=MetricFamily)


def values(family: MetricFamily) -> list[tuple[dict, float | None]]:
    return [(m.labels, m.value) for m in family.metrics]


def test_engine_gauges_sample_the_scheduler_until_closed():
    scheduler = types.SimpleNamespace(running=[1, 2], waiting=[3])
    engine = types.SimpleNamespace(scheduler=scheduler, paused_s=0.25)
    gauges = EngineGauges(PB_UTILS, "llm", engine, interval_s=0.01)
    requests, held = gauges.family
    wait_until(lambda: values(requests), lambda v: v[0][1] == 2, "the first sample")
    assert values(requests) == [
        ({"model": "llm", "state": "running"}, 2),
        ({"model": "llm", "state": "waiting"}, 1),
    ]
    assert (requests.name, held.name) == ("tritontts_llm_requests", "tritontts_llm_held_seconds")
    assert values(held) == [({"model": "llm"}, 0.25)]
    release_metrics(gauges)
    scheduler.running = []
    time.sleep(0.05)
    assert values(requests)[0][1] == 2 and gauges.family is None  # no sample after close


def test_open_streams_gauge_counts_what_the_model_keeps():
    streams = ["a", "b"]
    args = {"model_name": "token2wav_dit", "model_instance_name": "token2wav_dit_0_0"}
    gauge = OpenStreamsGauge(PB_UTILS, args, lambda: list(streams), interval_s=0.01)
    family = gauge.family
    wait_until(lambda: values(family), lambda v: v[0][1] == 2, "two open streams")
    streams.clear()
    wait_until(lambda: values(family), lambda v: v[0][1] == 0, "none left")
    assert family.metrics[0].labels == {"model": "token2wav_dit", "instance": "token2wav_dit_0_0"}
    release_metrics(gauge)
