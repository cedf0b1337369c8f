"""Where streams' first chunks spend their time, from the servers' Triton metrics read before and after a run.

The BLS counts `tritontts_first_chunk_seconds_total{stage}` / `tritontts_first_chunks_total`, the token2wav models
`tritontts_token2wav_seconds_total{stage, chunk}` / `tritontts_token2wav_executions_total{chunk}`; the difference
of two scrapes divided by the difference of the counts is the mean per first chunk over the run.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset], float]

BLS_SECONDS, BLS_COUNT = "tritontts_first_chunk_seconds_total", "tritontts_first_chunks_total"
TOKEN2WAV_SECONDS, TOKEN2WAV_COUNT = (
    "tritontts_token2wav_seconds_total",
    "tritontts_token2wav_executions_total",
)
STAGE_ORDER = ("frontend", "llm_first_token", "llm_chunk_tokens", "token2wav", "flow", "vocoder")
"""The order stages are reported in (a scrape's order is not theirs); others follow by name."""


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition by (name, labels)."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def scrape(url: str, timeout: float = 10.0) -> Samples:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return parse_samples(response.read().decode())


def _delta(before: Samples, after: Samples, name: str, where: Mapping[str, str]) -> dict[frozenset, float]:
    """after - before of each sample named `name` whose labels match `where`, by its labels."""
    return {
        labels: value - before.get((sample, labels), 0.0)
        for (sample, labels), value in after.items()
        if sample == name and all(dict(labels).get(k) == v for k, v in where.items())
    }


def stage_means_ms(
    before: Samples, after: Samples, seconds_name: str, count_name: str, where: Mapping[str, str]
) -> dict | None:
    """{"count": events, "stages_ms": {stage: mean ms per event}} over the matching label sets that counted
    events between the two scrapes, or None if none did."""
    counts = {labels: n for labels, n in _delta(before, after, count_name, where).items() if n > 0}
    if not counts:
        return None
    totals: dict[str, float] = {}
    for labels, seconds in _delta(before, after, seconds_name, where).items():
        stage = dict(labels)["stage"]
        if labels - {("stage", stage)} in counts:
            totals[stage] = totals.get(stage, 0.0) + seconds
    count = sum(counts.values())
    rank = {stage: i for i, stage in enumerate(STAGE_ORDER)}
    order = sorted(totals, key=lambda stage: (rank.get(stage, len(rank)), stage))
    return {"count": int(count), "stages_ms": {stage: 1000.0 * totals[stage] / count for stage in order}}


def first_chunk_breakdown(before: Samples, after: Samples, client_first_chunk_ms: float | None) -> dict:
    """The BLS's stages of a first chunk, token2wav's flow and vocoder on first chunks, and what the client
    waited beyond the BLS's stages (queueing, request parsing, response sending, the network)."""
    bls = stage_means_ms(before, after, BLS_SECONDS, BLS_COUNT, {})
    token2wav = stage_means_ms(before, after, TOKEN2WAV_SECONDS, TOKEN2WAV_COUNT, {"chunk": "first"})
    beyond = None
    if bls is not None and client_first_chunk_ms is not None:
        beyond = client_first_chunk_ms - sum(bls["stages_ms"].values())
    return {"bls": bls, "token2wav_first_chunk": token2wav, "client_beyond_bls_ms": beyond}


def breakdown_line(breakdown: dict) -> str:
    """One line for a terminal: stage means in ms."""
    parts = []
    for key in ("bls", "token2wav_first_chunk"):
        entry = breakdown.get(key)
        if entry:
            parts += [f"{stage} {ms:.1f}" for stage, ms in entry["stages_ms"].items()]
    if breakdown.get("client_beyond_bls_ms") is not None:
        parts.append(f"client beyond BLS {breakdown['client_beyond_bls_ms']:.1f}")
    return "first chunk, ms: " + (", ".join(parts) if parts else "no stage metrics on the server")


MODEL_COUNTERS = {
    "requests": "nv_inference_request_success",
    "executions": "nv_inference_exec_count",
    "request_us": "nv_inference_request_duration_us",
    "queue_us": "nv_inference_queue_duration_us",
    "compute_us": "nv_inference_compute_infer_duration_us",
}
"""Triton's own per-model counters (labels model, version); the parser names a counter's samples `<name>_total`."""


def model_breakdown(before: Samples, after: Samples) -> dict[str, dict]:
    """Per model that served requests between the scrapes: requests, mean requests per execution, and mean
    ms per request end to end (request), waiting in Triton's queue (queue) and in the model's execute
    (compute; a BLS's includes the models it calls, a decoupled model's ends when execute returns)."""
    totals: dict[str, dict[str, float]] = {}
    for key, name in MODEL_COUNTERS.items():
        for labels, value in _delta(before, after, name + "_total", {}).items():
            model = dict(labels).get("model")
            if model is not None:
                row = totals.setdefault(model, {})
                row[key] = row.get(key, 0.0) + value
    rows = {}
    for model in sorted(totals):
        t = totals[model]
        requests = t.get("requests", 0.0)
        if requests <= 0:
            continue
        rows[model] = {
            "requests": int(requests),
            "requests_per_execution": round(requests / t["executions"], 2) if t.get("executions") else None,
            **{
                f"{key[:-3]}_ms": round(t.get(key, 0.0) / requests / 1000.0, 2)
                for key in ("request_us", "queue_us", "compute_us")
            },
        }
    return rows


def model_breakdown_line(rows: dict[str, dict]) -> str:
    """One line for a terminal: each model's mean request ms and batch."""
    if not rows:
        return "per model: no Triton model counters moved"
    return "per model, ms per request: " + ", ".join(
        f"{model} {row['request_ms']:.1f} (queue {row['queue_ms']:.1f}, {row['requests_per_execution']}/exec)"
        for model, row in rows.items()
    )
