"""Generated figure blocks in README.md and docs/*.md: views of the benchmark JSON's headline rows.

A block is two marker lines, outside code fences, and the table between them::

    <!-- results: VIEW key=value key="a value, with spaces" -->
    (written by scripts/benchmark_results.py --write; do not edit)
    <!-- /results -->

VIEW names one of `VIEWS`; each takes the arguments its `View.args` lists (lists are comma-separated, values with
spaces are quoted). Every table names the JSON file of each figure, linked relative to the page. Standard library
only; no I/O: `tritontts.bench.results` reads and writes the pages.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from tritontts.bench.results_table import BenchFile, _cell, _table, gpu_label, headline_rows

OPEN = re.compile(r"^<!-- results: (?P<spec>.*?) -->$")
CLOSE = "<!-- /results -->"
FENCE = re.compile(r"^\s*(```|~~~)")

FAMILIES = {
    "spark_tts": "Spark-TTS",
    "cosyvoice2": "CosyVoice2",
    "cosyvoice2_dit": "CosyVoice2 + DiT",
    "cosyvoice3": "CosyVoice3",
}
ENGINE_MODEL = "spark_tts LLM"

Pair = tuple[BenchFile, dict]


class ViewError(ValueError):
    """A marker that names an unknown view or argument, a bad value, or a selection without rows."""


@dataclass(frozen=True)
class Block:
    """One generated block of a page: its opening marker's line (1-based), its spec and its body's lines."""

    line: int
    spec: str
    body: tuple[str, ...]


@dataclass(frozen=True)
class PageUpdate:
    """A page with its blocks rewritten, the blocks whose body differed, and the markers that failed."""

    text: str
    stale: tuple[Block, ...]
    problems: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class View:
    render: Callable[[list[BenchFile], dict, str], list[str]]
    args: dict[str, str]  # name -> "list", "ints" or "str"
    required: tuple[str, ...] = ()


def _link(prefix: str, name: str) -> str:
    return f"[{name}]({prefix}/{name})"


def _place(file: BenchFile, row: dict) -> str:
    count = row.get("gpu_count", file.data["meta"]["gpu_count"])
    return f"{gpu_label(file.data['meta'])} x{count}" if count > 1 else gpu_label(file.data["meta"])


def _newest(pairs: list[Pair]) -> list[Pair]:
    """Newest first: by the file's date, then its name, then the row's order in the file."""
    return sorted(pairs, key=lambda p: (p[0].data["meta"]["date"], p[0].name), reverse=True)


def _serving(files: list[BenchFile]) -> list[Pair]:
    return headline_rows(files)[0]


def _metrics(files: list[BenchFile]) -> list[Pair]:
    return headline_rows(files)[1]


def _one_gpu(pair: Pair) -> bool:
    return pair[1].get("gpu_count", pair[0].data["meta"]["gpu_count"]) == 1


def _group(pairs: list[Pair], key: Callable[[Pair], object]) -> dict:
    groups: dict = {}
    for pair in pairs:
        groups.setdefault(key(pair), []).append(pair)
    return groups


def _sources(pairs: list[Pair], prefix: str) -> str:
    return ", ".join(_link(prefix, name) for name in dict.fromkeys(f.name for f, _ in pairs))


def _first_chunk_rank(group: list[Pair], level: int) -> tuple:
    """Lowest first chunk at `level` first; a group without that level after every group with it."""
    first = [r["first_chunk_p50_ms"] for _, r in group if r["concurrency"] == level]
    first = [v for v in first if v is not None]
    return (0, min(first)) if first else (1, 0.0)


def _streaming(files: list[BenchFile], args: dict, prefix: str) -> list[str]:
    levels = args.get("c", [1, 4, 16])
    models = args.get("model") or list(FAMILIES)
    pairs = [p for p in _serving(files) if p[1]["mode"] == "streaming" and _one_gpu(p)]
    rows = []
    for model in models:
        for gpu in args["gpu"]:
            mine = [p for p in pairs if p[1]["model"] == model and gpu_label(p[0].data["meta"]) == gpu]
            groups = list(_group(_newest(mine), lambda p: (p[0].name, p[1]["layout"])).values())
            if not groups:
                continue
            group = min(groups, key=lambda g: _first_chunk_rank(g, levels[0]))
            cells = []
            for level in levels:
                values = [r["first_chunk_p50_ms"] for _, r in group if r["concurrency"] == level]
                cells.append(" / ".join(_cell(v) for v in values if v is not None) or _cell(None))
            rated = [r for _, r in group if r["audio_s_per_s"] is not None]
            best = max(rated, key=lambda r: r["audio_s_per_s"]) if rated else None
            peak = f"{_cell(best['audio_s_per_s'])} (c={best['concurrency']})" if best else _cell(None)
            name = FAMILIES.get(model, model)
            rows.append([name, gpu, _cell(group[0][1]["layout"]), *cells, peak, _sources(group, prefix)])
    if not rows:
        raise ViewError("selects no headline rows")
    header = ["family", "GPU", "setup", f"first chunk p50 ms, c={levels[0]}", *(f"c={c}" for c in levels[1:])]
    lines = _table([*header, "most audio-s/s (at c)", "JSON"], rows)
    return lines + [
        "",
        f"One GPU, streaming. Per family and GPU the setup with the lowest first chunk at c={levels[0]}; "
        "a / b: two rows of that file at one level (their notes say which pass).",
    ]


def _scale_out(files: list[BenchFile], args: dict, prefix: str) -> list[str]:
    model = args.get("model", "cosyvoice2")
    pairs = [
        p
        for p in _serving(files)
        if p[1]["model"] == model and "per GPU" in p[1]["layout"] and p[1]["audio_s_per_s"] is not None
    ]
    if "gpu" in args:
        pairs = [p for p in pairs if gpu_label(p[0].data["meta"]) in args["gpu"]]
    if not pairs:
        raise ViewError("selects no headline rows")
    newest = _newest(pairs)[0][0]
    mine = [p for p in pairs if p[0] is newest]
    counts = _group(mine, lambda p: p[1].get("gpu_count", newest.data["meta"]["gpu_count"]))
    best = {n: max(group, key=lambda p: p[1]["audio_s_per_s"])[1] for n, group in sorted(counts.items())}
    base = best.get(1)
    rows = []
    for count, row in best.items():
        scale = f"{row['audio_s_per_s'] / base['audio_s_per_s']:.2f}x" if base else _cell(None)
        figures = [_cell(row[k]) for k in ("first_chunk_p50_ms", "first_chunk_p99_ms", "audio_s_per_s")]
        rows.append([str(count), str(row["concurrency"]), *figures, scale])
    header = ["GPUs", "concurrency", "first chunk p50 ms", "p99 ms", "audio-s/s", "vs one GPU"]
    layout = mine[0][1]["layout"]
    return _table(header, rows) + [
        "",
        f"{model}, {layout}, {gpu_label(newest.data['meta'])}: per GPU count the level with the most "
        f"audio-s/s; {_link(prefix, newest.name)}.",
    ]


def _engine(files: list[BenchFile], args: dict, prefix: str) -> list[str]:
    model = args.get("model", ENGINE_MODEL)
    batches = args.get("batch", [1, 16, 64])
    pairs = [p for p in _metrics(files) if p[1]["model"] == model]
    gpus = _group(
        _newest([p for p in pairs if p[1]["metric"] == "decode step, batch 1"]),
        lambda p: gpu_label(p[0].data["meta"]),
    )
    rows, prefill_name = [], "prefill + first step"
    for gpu, group in sorted(gpus.items()):
        if "gpu" in args and gpu not in args["gpu"]:
            continue
        file = group[0][0]
        mine = {r["metric"]: r for f, r in pairs if f is file}
        steps = [_cell(mine.get(f"decode step, batch {b}", {}).get("value")) for b in batches]
        prefill = next((r for name, r in mine.items() if name.startswith("prefill")), None)
        speedup = next((r for name, r in mine.items() if name.startswith("speed-up over transformers")), None)
        if prefill:
            prefill_name = prefill["metric"]
        rows.append(
            [
                gpu,
                *steps,
                _cell(prefill["value"]) if prefill else _cell(None),
                f"{_cell(speedup['value'])}x" if speedup else _cell(None),
                _link(prefix, file.name),
            ]
        )
    if not rows:
        raise ViewError("selects no headline rows")
    header = [f"decode ms/step, batch {batches[0]}", *(f"batch {b}" for b in batches[1:])]
    return _table(["GPU", *header, f"{prefill_name}, ms", "vs transformers `generate`", "JSON"], rows) + [
        "",
        f"{model}, the newest file with a batch-1 decode step on each GPU.",
    ]


def _select(files: list[BenchFile], metric: bool, args: dict) -> list[Pair]:
    """The serving or metric rows of the files `args["file"]` names (an archived one as archive/NAME), in the
    order named, filtered by the other arguments."""
    by_name = {f.name: f for f in files}
    for name in args["file"]:
        if name not in by_name:
            raise ViewError(f"argument 'file': no benchmark file {name!r}")
    chosen = [
        (by_name[name], row)
        for name in args["file"]
        for row in by_name[name].data["headline"]
        if ("metric" in row) == metric
    ]
    for key in ("model", "mode", "layout"):
        if key in args:
            wanted = args[key] if isinstance(args[key], list) else [args[key]]
            chosen = [p for p in chosen if p[1].get(key) in wanted]
    if "c" in args:
        chosen = [p for p in chosen if p[1].get("concurrency") in args["c"]]
    if "metric" in args:
        chosen = [p for p in chosen if args["metric"] in p[1]["metric"]]
    if not chosen:
        raise ViewError("selects no headline rows")
    return chosen


SHARED = ("model", "layout", "mode", "GPU", "concurrency", "note", "JSON")


def _listing(pairs: list[Pair], columns: list[tuple[str, Callable[[Pair], str]]]) -> list[str]:
    """The rows' table; a column that holds one value for every row (model, layout, mode, GPU, concurrency, the
    note of several rows, JSON) goes to the line under the table instead, a column without any value is left out."""
    values = [[get(p) for _, get in columns] for p in pairs]
    keep, shared, source = [], [], ""
    for i, (name, _) in enumerate(columns):
        seen = {v[i] for v in values}
        if seen == {_cell(None)}:
            continue
        if name not in SHARED or len(seen) > 1 or (name == "note" and len(values) == 1):
            keep.append(i)
        elif name == "JSON":
            source = values[0][i]
        elif values[0][i] not in ", ".join(shared).split(", "):
            shared.append(f"c={values[0][i]}" if name == "concurrency" else values[0][i])
    lines = _table([columns[i][0] for i in keep], [[v[i] for i in keep] for v in values])
    caption = ", ".join(shared)
    if source:
        caption = f"{caption}: {source}" if caption else source
    return lines + ["", caption + "."] if caption else lines


def _value(row: dict) -> str:
    unit = row["unit"]
    return f"{_cell(row['value'])}{'' if unit in ('x', '%') else ' '}{_cell(unit)}"


def _serving_list(files: list[BenchFile], args: dict, prefix: str) -> list[str]:
    columns = [
        ("model", lambda p: _cell(p[1]["model"])),
        ("layout", lambda p: _cell(p[1]["layout"])),
        ("mode", lambda p: _cell(p[1]["mode"])),
        ("GPU", lambda p: _place(*p)),
        ("concurrency", lambda p: _cell(p[1]["concurrency"])),
        ("first chunk p50 ms", lambda p: _cell(p[1]["first_chunk_p50_ms"])),
        ("p99 ms", lambda p: _cell(p[1]["first_chunk_p99_ms"])),
        ("RTF", lambda p: _cell(p[1]["rtf"])),
        ("audio-s/s", lambda p: _cell(p[1]["audio_s_per_s"])),
        ("note", lambda p: _cell(p[1].get("note"))),
        ("JSON", lambda p: _link(prefix, p[0].name)),
    ]
    return _listing(_select(files, False, args), columns)


def _metric_list(files: list[BenchFile], args: dict, prefix: str) -> list[str]:
    columns = [
        ("model", lambda p: _cell(p[1]["model"])),
        ("metric", lambda p: _cell(p[1]["metric"])),
        ("value", lambda p: _value(p[1])),
        ("layout", lambda p: _cell(p[1].get("layout"))),
        ("mode", lambda p: _cell(p[1].get("mode"))),
        ("GPU", lambda p: _place(*p)),
        ("note", lambda p: _cell(p[1].get("note"))),
        ("JSON", lambda p: _link(prefix, p[0].name)),
    ]
    return _listing(_select(files, True, args), columns)


VIEWS: dict[str, View] = {
    "streaming": View(_streaming, {"gpu": "list", "c": "ints", "model": "list"}, ("gpu",)),
    "scale_out": View(_scale_out, {"model": "str", "gpu": "list"}),
    "engine": View(_engine, {"model": "str", "gpu": "list", "batch": "ints"}),
    "serving": View(
        _serving_list,
        {"file": "list", "model": "list", "mode": "str", "layout": "str", "c": "ints"},
        ("file",),
    ),
    "metrics": View(_metric_list, {"file": "list", "model": "list", "metric": "str"}, ("file",)),
}


def parse_spec(spec: str) -> tuple[View, dict]:
    """The view a marker names and its arguments, parsed; ViewError where either is wrong."""
    try:
        words = shlex.split(spec)
    except ValueError as exc:
        raise ViewError(f"cannot parse {spec!r}: {exc}") from None
    if not words or words[0] not in VIEWS:
        name = words[0] if words else ""
        raise ViewError(f"unknown view {name!r} (views: {', '.join(VIEWS)})")
    view, args = VIEWS[words[0]], {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or key not in view.args:
            raise ViewError(f"view {words[0]!r}: unknown argument {word!r} (takes {', '.join(view.args)})")
        if view.args[key] == "str":
            args[key] = value
            continue
        items = [v.strip() for v in value.split(",") if v.strip()]
        if view.args[key] == "ints":
            if not all(v.isdigit() and int(v) > 0 for v in items):
                raise ViewError(f"view {words[0]!r}: {key} must be integers >= 1, got {value!r}")
            items = [int(v) for v in items]
        args[key] = items
    missing = [k for k in view.required if k not in args]
    if missing:
        raise ViewError(f"view {words[0]!r}: missing argument {', '.join(missing)}")
    return view, args


def render_view(spec: str, files: list[BenchFile], prefix: str) -> list[str]:
    """A block's body: a blank line, the view's table and its line of provenance, a blank line."""
    view, args = parse_spec(spec)
    return ["", *view.render(files, args, prefix), ""]


def update(text: str, files: list[BenchFile], prefix: str) -> PageUpdate:
    """`text` with every block's body rewritten from `files`; links to the JSON start with `prefix`."""
    lines = text.split("\n")
    out: list[str] = []
    stale, problems = [], []
    fenced, index = False, 0
    while index < len(lines):
        line = lines[index]
        out.append(line)
        index += 1
        if FENCE.match(line):
            fenced = not fenced
        if fenced:
            continue
        if line == CLOSE:
            problems.append((index, f"{CLOSE} without an opening <!-- results: VIEW -->"))
            continue
        opened = OPEN.match(line)
        if not opened:
            continue
        start = index
        while index < len(lines) and lines[index] != CLOSE and not OPEN.match(lines[index]):
            index += 1
        if index == len(lines) or lines[index] != CLOSE:
            problems.append((start, f"{line} is not closed by {CLOSE}"))
            index = start
            continue
        block = Block(start, opened.group("spec"), tuple(lines[start:index]))
        try:
            body = render_view(block.spec, files, prefix)
        except ViewError as exc:
            problems.append((start, f"block 'results: {block.spec}': {exc}"))
            body = list(block.body)
        if tuple(body) != block.body:
            stale.append(block)
        out += [*body, CLOSE]
        index += 1
    return PageUpdate("\n".join(out), tuple(stale), tuple(problems))
