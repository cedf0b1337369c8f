"""Custom Triton metrics of the python-backend models."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


def release_metrics(*holders: Closable) -> None:
    """For a model's `finalize`: drop its metric objects now and collect them, while the stub can still tell the
    server. A Metric or MetricFamily that outlives `finalize` is destroyed in the stub's teardown, after the
    stub's IPC is gone, and its destructor then crashes the stub (`Fatal Python error: Segmentation fault`,
    no Python frame, at every unload of a model that had metrics)."""
    for holder in holders:
        holder.close()
    gc.collect()


class VoiceCacheCounters:
    """`tritontts_voice_cache_{hits,misses}_total{model=...}` of a model's voice cache.

    Holds the metric families too: Triton drops a family's metrics when the family object is deleted.
    """

    def __init__(self, pb_utils: Any, model_name: str) -> None:
        self.families = [
            pb_utils.MetricFamily(
                name=f"tritontts_voice_cache_{kind}_total",
                description=f"reference audios whose results were {what}",
                kind=pb_utils.MetricFamily.COUNTER,
            )
            for kind, what in (("hits", "found in the voice cache"), ("misses", "computed"))
        ]
        self.hits, self.misses = (family.Metric(labels={"model": model_name}) for family in self.families)

    def count(self, hit: bool, n: int = 1) -> None:
        (self.hits if hit else self.misses).increment(n)

    def close(self) -> None:
        self.hits = self.misses = None
        self.families = []


class StageSeconds:
    """Summed stage durations `{seconds_name}{model, stage, ...}` and the count of timed events
    `{count_name}{model, ...}`: a scraper's delta of one over the delta of the other is a mean per event."""

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        seconds_name: str,
        count_name: str,
        what: str,
        labels: dict[str, str] | None = None,
    ) -> None:
        counter = pb_utils.MetricFamily.COUNTER
        self.seconds = pb_utils.MetricFamily(
            name=seconds_name, description=f"seconds spent in each stage of {what}", kind=counter
        )
        self.count = pb_utils.MetricFamily(name=count_name, description=f"{what} timed", kind=counter)
        self.labels = {"model": model_name, **(labels or {})}
        self._metrics: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _metric(self, family: Any, labels: dict[str, str]) -> Any:
        key = (id(family), tuple(sorted(labels.items())))
        if key not in self._metrics:
            self._metrics[key] = family.Metric(labels=labels)
        return self._metrics[key]

    def add(self, stages: dict[str, float], **labels: str) -> None:
        base = {**self.labels, **labels}
        with self._lock:
            self._metric(self.count, base).increment(1)
            for stage, seconds in stages.items():
                self._metric(self.seconds, base | {"stage": stage}).increment(seconds)

    def close(self) -> None:
        with self._lock:
            self._metrics.clear()
            self.seconds = self.count = None


def first_chunk_stage_seconds(pb_utils: Any, model_name: str) -> StageSeconds:
    """A BLS's `tritontts_first_chunk_seconds_total{model, stage}` / `tritontts_first_chunks_total{model}`: each
    stream's first chunk, stage by stage (tritontts.bench.server_stages reads them)."""
    return StageSeconds(
        pb_utils,
        model_name,
        "tritontts_first_chunk_seconds_total",
        "tritontts_first_chunks_total",
        "streams' first chunks in the BLS",
    )


def token2wav_stage_seconds(pb_utils: Any, args: dict[str, Any]) -> StageSeconds:
    """Flow and vocoder seconds of a token2wav instance's executes (`args`: the model's initialize args), labelled
    with the instance and `chunk="first"` where every call of the execute (or of its group:
    tritontts.triton.token2wav_calls) was a stream's first chunk."""
    return StageSeconds(
        pb_utils,
        args["model_name"],
        "tritontts_token2wav_seconds_total",
        "tritontts_token2wav_executions_total",
        "token2wav executes",
        {"instance": args["model_instance_name"]},
    )


def gauge_family(pb_utils: Any, name: str, description: str) -> Any:
    return pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)


class SampledGauges:
    """Gauges set every `interval_s` on a daemon thread by `read()`: {metric: value}; `close` stops it."""

    def __init__(self, family: Any, metrics: dict[str, Any], name: str, interval_s: float) -> None:
        self.family = family
        self.metrics = metrics
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=name, daemon=True)
        self._thread.start()

    def read(self) -> dict[str, float]:
        raise NotImplementedError

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            for key, value in self.read().items():
                self.metrics[key].set(value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.metrics = {}
        self.family = None


class EngineGauges(SampledGauges):
    """`tritontts_llm_requests{model, state="running"|"waiting"}`: the requests our LLM engine holds a slot for
    and those waiting for one, sampled every `interval_s`. After every client has gone, both read 0: no request
    is left running and no slot is held. `tritontts_llm_held_seconds{model}`: the seconds the engine has held its
    steps since it loaded, for token2wav's first chunks (tritontts.triton.first_chunk_priority)."""

    def __init__(self, pb_utils: Any, model_name: str, engine: Any, interval_s: float = 0.5) -> None:
        requests = gauge_family(
            pb_utils,
            "tritontts_llm_requests",
            "requests of the LLM engine: running (holding a slot) or waiting for one",
        )
        held = gauge_family(
            pb_utils,
            "tritontts_llm_held_seconds",
            "seconds the LLM engine held its steps for token2wav first chunks since it loaded",
        )
        metrics = {
            s: requests.Metric(labels={"model": model_name, "state": s}) for s in ("running", "waiting")
        }
        metrics["held"] = held.Metric(labels={"model": model_name})
        self.engine = engine
        super().__init__([requests, held], metrics, "llm-gauges", interval_s)

    def read(self) -> dict[str, float]:
        scheduler = self.engine.scheduler
        return {
            "running": len(scheduler.running),
            "waiting": len(scheduler.waiting),
            "held": self.engine.paused_s,
        }


class OpenStreamsGauge(SampledGauges):
    """`tritontts_token2wav_open_streams{model, instance}`: the streams whose state a token2wav instance keeps,
    sampled every `interval_s` (`open_streams()` also drops the states gone quiet past their idle timeout,
    tritontts.stream_states, so they go even when no call comes). After every client has gone and every stream
    ended, it reads 0; a value that keeps growing is streams that were never ended."""

    def __init__(
        self,
        pb_utils: Any,
        args: dict[str, Any],
        open_streams: Callable[[], list[str]],
        interval_s: float = 1.0,
    ) -> None:
        family = gauge_family(
            pb_utils,
            "tritontts_token2wav_open_streams",
            "streams whose state a token2wav instance keeps until their finalize call",
        )
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        self.open_streams = open_streams
        super().__init__(family, {"open": family.Metric(labels=labels)}, "open-streams", interval_s)

    def read(self) -> dict[str, float]:
        return {"open": len(self.open_streams())}


class VoicePrefixGauges(SampledGauges):
    """`tritontts_token2wav_voice_prefix_bytes{model, instance}`: the bytes of voice flow prefixes a token2wav
    instance keeps (within its `voice_prefix_gib`), and `tritontts_token2wav_voice_prefixes_made{model,
    instance}`: how many it has made since it loaded (tritontts.cosyvoice2.flow.voice_prefixes); sampled every
    `interval_s`. Made growing much faster than the voices in use means the budget is too small for them."""

    def __init__(
        self,
        pb_utils: Any,
        args: dict[str, Any],
        read: Callable[[], tuple[int, int]],
        interval_s: float = 1.0,
    ) -> None:
        kept = gauge_family(
            pb_utils,
            "tritontts_token2wav_voice_prefix_bytes",
            "bytes of voice flow prefixes a token2wav instance keeps",
        )
        made = gauge_family(
            pb_utils,
            "tritontts_token2wav_voice_prefixes_made",
            "voice flow prefixes a token2wav instance has made since it loaded",
        )
        labels = {"model": args["model_name"], "instance": args["model_instance_name"]}
        metrics = {"bytes": kept.Metric(labels=labels), "made": made.Metric(labels=labels)}
        self._read = read
        super().__init__([kept, made], metrics, "voice-prefix-gauges", interval_s)

    def read(self) -> dict[str, float]:
        kept, made = self._read()
        return {"bytes": kept, "made": made}
