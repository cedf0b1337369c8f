"""The benchmark suite's headline rows: each part's raw output (a bench script's JSON, client_grpc.py's
summary.json) turned into rows of the schema of `tritontts/bench/results.py`. Pure functions, no I/O."""

from __future__ import annotations

import re
from typing import Any

DTYPE_NAMES = {"torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float32": "fp32"}


def _round(value: float, digits: int) -> float:
    return round(float(value), digits)


def _metric(model: str, metric: str, value: float, unit: str, layout: str, **extra: Any) -> dict:
    row = {"model": model, "metric": metric, "value": value, "unit": unit, "layout": layout}
    row.update({k: v for k, v in extra.items() if v is not None})
    return row


def engine_rows(raw: dict) -> list[dict]:
    """bench_llm.py's JSON: the decode step per batch size (the reference decoder's in the note), the prefill of
    one prompt with the first step, and the end-to-end speed-up over transformers `generate`."""
    settings = raw.get("settings", {})
    model = "tiny synthetic LLM" if settings.get("tiny") else "spark_tts LLM"
    path = "CUDA graphs" if settings.get("graphs_captured") else "eager"
    if settings.get("compile"):
        path += " + torch.compile"
    layout = f"scripts/bench_llm.py, {path}, {raw.get('dtype', '?')}"
    if str(settings.get("output_tokens_from", "0")) not in ("0", ""):
        layout += f", output window from id {settings['output_tokens_from']}"
    ours, reference = raw.get("ours", {}), raw.get("reference") or {}
    rows = []
    batches = sorted((k for k in ours if re.fullmatch(r"batch_\d+", k)), key=lambda k: int(k[6:]))
    for key in batches:
        batch = int(key[6:])
        note = None
        if key in reference:
            note = (
                f"bench_llm_reference.py in the same run: {reference[key]['decode_ms_per_step_median']:.3f}"
            )
        elif "error" in reference:
            note = "bench_llm_reference.py failed (see the raw JSON)"
        rows.append(
            _metric(
                model,
                f"decode step, batch {batch}",
                _round(ours[key]["decode_ms_per_step_median"], 3),
                "ms",
                layout,
                concurrency=batch,
                note=note,
            )
        )
    first = ours.get("first_token", {}).get("prefill_plus_first_step_ms_graph")
    if first is not None:
        prompt = settings.get("prompt_len", "?")
        rows.append(
            _metric(model, f"prefill of a {prompt}-token prompt + first step", _round(first, 2), "ms", layout)
        )
    for key, entry in (raw.get("transformers_generate") or {}).items():
        speedup = (raw.get("checks") or {}).get(f"speedup_{key}")
        if speedup is None:
            continue
        rows.append(
            _metric(
                model,
                f"speed-up over transformers generate, batch {key[6:]}, end to end",
                _round(speedup, 1),
                "x",
                layout,
                concurrency=int(key[6:]),
                note=f"transformers generate: {entry['decode_ms_per_step']:.1f} ms/step",
            )
        )
    return rows


def _graph_path(raw: dict) -> str:
    """How the 'graphed' side ran: from CUDA graphs, or (CPU dry checks) the same padded calls, eagerly."""
    captured = (raw.get("capture") or {}).get("graphs", 0) > 0
    return "CUDA graphs" if captured else "padded calls, no capture"


def flow_graphs_rows(raw: dict, prompt_tokens: int = 75) -> list[dict]:
    """bench_flow_graphs.py's JSON: CosyVoice2's token2wav first chunk and 5 s offline call graphed (eager in
    the note), and the first round of N lockstep streams."""
    dtype = DTYPE_NAMES.get(raw.get("flow_dtype", ""), raw.get("flow_dtype", "?"))
    layout = f"scripts/bench_flow_graphs.py, {dtype}"
    model = "cosyvoice2 token2wav"
    path = _graph_path(raw)
    eager, graphed = raw["eager"], raw["graphed"]
    rows = [
        _metric(
            model,
            f"first streamed chunk ({prompt_tokens}-token prompt), {path}",
            graphed["first_chunk_ms"],
            "ms",
            layout,
            concurrency=1,
            note=f"eager: {eager['first_chunk_ms']}",
        ),
        _metric(
            model,
            f"5 s offline ({prompt_tokens}-token prompt), {path}",
            graphed["offline_5s_ms"],
            "ms",
            layout,
            concurrency=1,
            note=f"eager: {eager['offline_5s_ms']}",
        ),
    ]
    kernels = graphed.get("first_chunk_kernels"), eager.get("first_chunk_kernels")
    rows += _kernel_rows(model, "first streamed chunk", path, layout, *kernels)
    streams = {(row["streams"], row["path"]): row for row in raw.get("streams", [])}
    for (count, side), row in sorted(streams.items()):
        if side != "graphed":
            continue
        other = streams.get((count, "eager"))
        note = f"{row['audio_s_per_s']} audio-s/s"
        if other:
            note += f"; eager: {other['first_round_ms']} ms, {other['audio_s_per_s']} audio-s/s"
        rows.append(
            _metric(
                model,
                f"{count} stream{'s' if count > 1 else ''} in lockstep, first chunk round, {path}",
                row["first_round_ms"],
                "ms",
                layout,
                concurrency=count,
                note=note,
            )
        )
    return rows


def _kernel_rows(
    model: str, what: str, path: str, layout: str, graphed: dict | None, eager: dict | None
) -> list:
    """The kernels one call launches (`tritontts.bench.kernel_profile`'s count), eager in the note; none where
    the bench JSON predates the count."""
    if graphed is None:
        return []
    note = f"{graphed['ms_per_call']} ms of them"
    if eager:
        note += f"; eager: {eager['per_call']} in {eager['ms_per_call']} ms"
    return [
        _metric(
            model, f"{graphed['unit']} per {what}, {path}", graphed["per_call"], "kernels", layout, note=note
        )
    ]


DIT_CASES = {
    "first_chunk": "first streamed chunk",
    "later_chunk": "later streamed chunk (full cache)",
    "offline_5s": "5 s offline",
}


def dit_flow_graphs_rows(raw: dict) -> list[dict]:
    """bench_dit_flow_graphs.py's JSON: the DiT token2wav's chunks and offline call graphed, eager in the note
    (on the CPU the 'graphed' path is the padded calls run eagerly, and the rows say so)."""
    dtype = DTYPE_NAMES.get(raw.get("flow_dtype", ""), raw.get("flow_dtype", "?"))
    layout = f"scripts/bench_dit_flow_graphs.py, {dtype}"
    path = _graph_path(raw)
    rows = []
    for key, label in DIT_CASES.items():
        case = raw.get("cases", {}).get(key)
        if case is None:
            continue
        rows.append(
            _metric(
                "cosyvoice2_dit token2wav",
                f"{label}, {path}",
                case["graphed_ms"],
                "ms",
                layout,
                concurrency=1,
                note=f"eager: {case['eager_ms']}",
            )
        )
        kernels = case.get("graphed_kernels"), case.get("eager_kernels")
        rows += _kernel_rows("cosyvoice2_dit token2wav", label, path, layout, *kernels)
    return rows


def vocoder_graphs_rows(raw: dict) -> list[dict]:
    """bench_vocoder_graphs.py's JSON: one call per mel length of CosyVoice2's HiFT and CosyVoice3's causal
    HiFT, replayed from its graph (eager in the note)."""
    path = "CUDA graph" if raw.get("cuda_graphs", True) else "no capture"
    return [
        _metric(
            row["model"],
            f"one call, {row['mel_frames']} mel frames, {path}",
            row["graphed_ms"],
            "ms",
            "scripts/bench_vocoder_graphs.py, fp32",
            concurrency=1,
            note=f"eager: {row['eager_ms']}",
        )
        for row in raw.get("rows", [])
    ]


def serving_layout(serve_args: list[str], family: str) -> str:
    """'one tritonserver', with MPS and the token2wav instances (not Spark-TTS's) where the serving options ask
    for them."""
    options = dict(zip(serve_args[::2], serve_args[1::2]))
    layout = "one tritonserver"
    if options.get("--cuda_mps") == "true":
        layout += ", MPS"
    instances = options.get("--token2wav_instance_num", "1")
    if family != "spark_tts" and instances.isdigit() and int(instances) > 1:
        layout += f", {instances} token2wav instances"
    return layout


def _ms(stats: dict | None, key: str) -> float | None:
    return None if not stats else _round(1000 * stats[key], 1)


def serving_rows(summary: dict, model: str, layout: str) -> list[dict]:
    """client_grpc.py's summary.json: one serving row per concurrency (first chunk null when offline)."""
    rows = []
    for run in summary.get("runs", []):
        row = {
            "model": model,
            "layout": layout,
            "mode": run["mode"],
            "concurrency": run["concurrency"],
            "first_chunk_p50_ms": _ms(run.get("first_chunk_latency"), "p50"),
            "first_chunk_p99_ms": _ms(run.get("first_chunk_latency"), "p99"),
            "rtf": None if run.get("rtf") is None else _round(run["rtf"], 4),
            "audio_s_per_s": None if run.get("throughput") is None else _round(run["throughput"], 2),
        }
        if run.get("failed"):
            row["note"] = f"{run['failed']} of {run['requests']} requests failed"
        rows.append(row)
    return rows
