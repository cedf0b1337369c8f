"""Models unload without crashing their stub: a Metric or MetricFamily (or a BLS's held request) that outlived
`finalize` was destroyed in the stub's teardown, after its IPC was gone, and every such stub printed
`Fatal Python error: Segmentation fault` at unload."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import tritonclient.http as httpclient
from spark_models import build_spark_models
from triton_stream import Stream
from waiting import wait_until

from tritontts.triton import stub_objects
from tritontts.triton.llm_contract import SamplingParams, llm_request_inputs
from tritontts.triton.metrics import StageSeconds, VoiceCacheCounters, release_metrics

TRITON_MODELS = [build_spark_models]
FATAL = "Fatal Python error"


class FakeMetric:
    def __init__(self, labels: dict) -> None:
        self.labels = labels

    def increment(self, n: float) -> None:
        pass


class FakeFamily:
    COUNTER = "counter"
    GAUGE = "gauge"

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict) -> FakeMetric:  # noqa: N802 (pb_utils' name)
        return FakeMetric(labels)


class FakePbUtils:
    MetricFamily = FakeFamily


def test_release_metrics_drops_every_metric_object_of_its_holders():
    counters = VoiceCacheCounters(FakePbUtils, "audio_tokenizer")
    stages = StageSeconds(FakePbUtils, "token2wav", "s_total", "n_total", "calls")
    counters.count(True)
    stages.add({"flow": 0.1, "vocoder": 0.2}, chunk="first")
    objects = [counters.hits, counters.misses, *counters.families, stages.seconds, stages.count]
    objects += list(stages._metrics.values())
    refs = [weakref.ref(obj) for obj in objects]
    del objects
    release_metrics(counters, stages)
    assert [ref() for ref in refs] == [None] * len(refs)


def test_release_held_drops_what_the_bls_held():
    class Held:
        pass

    held = Held()
    ref = weakref.ref(held)
    stub_objects.hold_until_stub_done(held)
    del held
    gc.collect()
    assert ref() is not None
    stub_objects.release_held()
    assert ref() is None


def fatal_lines(log: Path) -> int:
    return log.read_text(errors="replace").count(FATAL)


def test_an_llm_model_with_metrics_unloads_without_a_stub_fault(triton):
    """`tensorrt_llm_every3` (our engine, its request gauges) serves a stream, then unloads: the server log gains
    no fatal error, and the model can be loaded again."""
    server = triton.load("tensorrt_llm_every3")
    log = Path(server.server.config.log_file)
    arrays = llm_request_inputs(
        [101, 102, 103, 104], 151645, 151643, SamplingParams(max_tokens=12, seed=3), True
    )
    result = Stream(server.grpc_url, "tensorrt_llm_every3", arrays, ["output_ids", "sequence_length"]).read()
    assert result.error is None and result.outputs
    before = fatal_lines(log)
    client = httpclient.InferenceServerClient(server.http_url)
    client.unload_model("tensorrt_llm_every3")
    triton.loaded.discard("tensorrt_llm_every3")
    wait_until(
        lambda: log.read_text(errors="replace"),
        lambda text: "successfully unloaded 'tensorrt_llm_every3'" in text,
        what="the server's log saying tensorrt_llm_every3 is unloaded",
        timeout=60,
    )
    assert fatal_lines(log) == before, server.server.log_tail()
    client.close()
