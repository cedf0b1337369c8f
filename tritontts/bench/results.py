"""The common schema of benchmarks/*.json and the benchmarks/RESULTS.md written from it.

Every benchmark JSON keeps its own raw data and carries two top-level blocks besides:

- ``meta``: ``device`` (str, the machine as the file states it), ``gpu_count`` (int, 0 for CPU-only runs),
  ``date`` (``YYYY-MM-DD``), ``commit`` (str starting with the 7-40 hex digits of the code measured; words may
  follow), ``command`` (str, or a list of str), ``what`` (str: what the file measures, one sentence or two).
- ``headline``: a list, possibly empty, of the file's figures that are current. A row is either a serving row
  (``model``, ``layout``, ``mode``, ``concurrency``, ``first_chunk_p50_ms``, ``first_chunk_p99_ms``, ``rtf``,
  ``audio_s_per_s``; a figure not measured is null) or a metric row (``model``, ``metric``, ``value``, ``unit``;
  ``layout``, ``mode`` and ``concurrency`` optional), for kernels, decode steps and the like. Either kind may add
  ``note`` (str), ``gpu_count`` (int, where the row ran on fewer GPUs than the file's machine has) and
  ``commit`` (the row's own code, where it differs from the file's).

Superseded files live in ``benchmarks/archive/``: they keep the schema, RESULTS.md leaves them out.
The same check and write cover the generated blocks of README.md and docs/*.md (their views:
`tritontts.bench.results_views`). No I/O outside `load_files`, `page_paths`, `check` and `write`; no dependency
beyond the standard library.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritontts.bench import results_views
from tritontts.bench.results_table import BenchFile, _cell, _table, gpu_label, headline_rows  # noqa: F401 (names of this module too)

RESULTS_NAME = "RESULTS.md"
ARCHIVE_DIR = "archive"

META_FIELDS = ("device", "gpu_count", "date", "commit", "command", "what")
SERVING_FIELDS = (
    "model",
    "layout",
    "mode",
    "concurrency",
    "first_chunk_p50_ms",
    "first_chunk_p99_ms",
    "rtf",
    "audio_s_per_s",
)
SERVING_FIGURES = SERVING_FIELDS[4:]
METRIC_FIELDS = ("model", "metric", "value", "unit")
METRIC_OPTIONAL = ("layout", "mode", "concurrency")
ROW_OPTIONAL = ("note", "gpu_count", "commit")

_COMMIT = re.compile(r"^[0-9a-f]{7,40}(?![0-9a-zA-Z])")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True)
class SchemaError:
    """One missing or malformed field: `path` names the file, `field` the place inside it."""

    path: str
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.field}: {self.problem}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _nonempty_str(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def validate_meta(meta: Any, path: str) -> list[SchemaError]:
    if not isinstance(meta, dict):
        return [SchemaError(path, "meta", "missing" if meta is None else "must be an object")]
    errors = []

    def bad(name: str, problem: str) -> None:
        errors.append(SchemaError(path, f"meta.{name}", problem))

    for name in META_FIELDS:
        if name not in meta:
            bad(name, "missing")
    for name in sorted(set(meta) - set(META_FIELDS)):
        bad(name, f"unknown field (meta holds {', '.join(META_FIELDS)})")
    if "device" in meta and not _nonempty_str(meta["device"]):
        bad("device", "must be a non-empty string")
    if "what" in meta and not _nonempty_str(meta["what"]):
        bad("what", "must be a non-empty string")
    if "gpu_count" in meta and not (_is_int(meta["gpu_count"]) and meta["gpu_count"] >= 0):
        bad("gpu_count", "must be an integer >= 0")
    if "date" in meta:
        date = meta["date"]
        try:
            ok = isinstance(date, str) and bool(_DATE.match(date)) and bool(datetime.date.fromisoformat(date))
        except ValueError:
            ok = False
        if not ok:
            bad("date", f"must be a date YYYY-MM-DD, got {date!r}")
    if "commit" in meta and not (isinstance(meta["commit"], str) and _COMMIT.match(meta["commit"])):
        bad("commit", f"must start with a 7-40 digit hex commit, got {meta['commit']!r}")
    if "command" in meta:
        command = meta["command"]
        if isinstance(command, list):
            ok = bool(command) and all(_nonempty_str(c) for c in command)
        else:
            ok = _nonempty_str(command)
        if not ok:
            bad("command", "must be a non-empty string or a non-empty list of non-empty strings")
    return errors


def validate_row(row: Any, path: str, where: str) -> list[SchemaError]:
    if not isinstance(row, dict):
        return [SchemaError(path, where, "must be an object")]
    errors = []

    def bad(name: str, problem: str) -> None:
        errors.append(SchemaError(path, f"{where}.{name}", problem))

    metric = "metric" in row
    required = METRIC_FIELDS if metric else SERVING_FIELDS
    allowed = set(required) | set(ROW_OPTIONAL) | (set(METRIC_OPTIONAL) if metric else set())
    for name in required:
        if name not in row:
            bad(name, "missing")
    for name in sorted(set(row) - allowed):
        bad(name, "unknown field")
    for name in ("model", "layout", "mode", "metric", "unit", "note"):
        if name in row and not _nonempty_str(row[name]):
            bad(name, "must be a non-empty string")
    if "concurrency" in row and not (_is_int(row["concurrency"]) and row["concurrency"] >= 1):
        bad("concurrency", "must be an integer >= 1")
    if "gpu_count" in row and not (_is_int(row["gpu_count"]) and row["gpu_count"] >= 0):
        bad("gpu_count", "must be an integer >= 0")
    if "commit" in row and not (isinstance(row["commit"], str) and _COMMIT.match(row["commit"])):
        bad("commit", "must start with a 7-40 digit hex commit")
    if metric:
        if "value" in row and not _is_number(row["value"]):
            bad("value", "must be a finite number")
    else:
        for name in SERVING_FIGURES:
            if name in row and row[name] is not None and not _is_number(row[name]):
                bad(name, "must be a finite number or null")
        if all(row.get(name) is None for name in SERVING_FIGURES) and all(n in row for n in SERVING_FIGURES):
            bad("rtf", "a serving row needs at least one figure that is not null")
    return errors


def validate(data: Any, path: str) -> list[SchemaError]:
    """Every schema error of one benchmark JSON's data; `path` is how messages name the file."""
    if not isinstance(data, dict):
        return [SchemaError(path, "(top level)", "must be a JSON object")]
    errors = validate_meta(data.get("meta"), path)
    headline = data.get("headline")
    if headline is None:
        errors.append(SchemaError(path, "headline", "missing (an empty list where no figure is current)"))
    elif not isinstance(headline, list):
        errors.append(SchemaError(path, "headline", "must be a list"))
    else:
        for index, row in enumerate(headline):
            errors.extend(validate_row(row, path, f"headline[{index}]"))
    return errors


def benchmark_paths(bench_dir: Path) -> list[Path]:
    """benchmarks/*.json and benchmarks/archive/*.json, sorted."""
    return sorted(bench_dir.glob("*.json")) + sorted((bench_dir / ARCHIVE_DIR).glob("*.json"))


def load_files(bench_dir: Path) -> tuple[list[BenchFile], list[SchemaError]]:
    """Every benchmark JSON under `bench_dir` (archive included) and the schema errors they hold."""
    bench_dir = Path(bench_dir)
    files, errors = [], []
    for path in benchmark_paths(bench_dir):
        name = path.relative_to(bench_dir).as_posix()
        shown = f"{bench_dir.name}/{name}"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            errors.append(SchemaError(shown, "(file)", f"not readable JSON: {exc}"))
            continue
        file_errors = validate(data, shown)
        errors.extend(file_errors)
        if not file_errors:
            files.append(BenchFile(name=name, archived=name.startswith(f"{ARCHIVE_DIR}/"), data=data))
    return files, errors


def _code(text: str) -> str:
    text = text.replace("\n", " ").replace("|", "\\|")
    return f"`{text}`" if "`" not in text else text


def _command(meta: dict) -> str:
    command = meta["command"]
    return _code(command if isinstance(command, str) else " ; ".join(command))


def _commit(meta: dict, row: dict) -> str:
    """The commit as git abbreviates it (7 digits): a table column, the JSON keeps what it recorded."""
    return _COMMIT.match(row.get("commit") or meta["commit"]).group(0)[:7]


SERVING_KEYS = (*SERVING_FIELDS, "note")
SERVING_HEADER = [
    "model",
    "layout",
    "mode",
    "concurrency",
    "first chunk p50 ms",
    "first chunk p99 ms",
    "RTF",
    "audio-s/s",
    "note",
]
METRIC_KEYS = (*METRIC_FIELDS, *METRIC_OPTIONAL, "note")
METRIC_HEADER = list(METRIC_KEYS)
PROVENANCE_HEADER = ["GPU", "GPU count", "commit", "date", "command", "file"]


def _rows(pairs: list, keys: tuple[str, ...]) -> list[list[str]]:
    """One table row per (file, headline row): the row's own columns, then where and how it was measured."""
    rows = []
    for file, row in pairs:
        meta = file.data["meta"]
        provenance = [
            gpu_label(meta),
            _cell(row.get("gpu_count", meta["gpu_count"])),
            _commit(meta, row),
            meta["date"],
            _command(meta),
            f"[{file.name}]({file.name})",
        ]
        rows.append([_cell(row.get(key)) for key in keys] + provenance)
    return rows


def render(files: list[BenchFile]) -> str:
    """RESULTS.md for these files (the archived ones left out)."""
    serving, metrics = headline_rows(files)
    current = [f for f in files if not f.archived]
    bare = [f for f in current if not f.data["headline"]]
    lines = [
        "# Benchmark results",
        "",
        "Written by `python scripts/benchmark_results.py --write` from the `meta` and `headline` blocks of",
        "`benchmarks/*.json` (schema: `tritontts/bench/results.py`); do not edit it by hand: CI runs `--check`,",
        "which fails when this file is out of date or a JSON misses the schema. Each file's headline holds the",
        "figures that are current: the newest measurement of each model, mode and layout on each GPU type",
        "(the kept side of an A/B). Superseded files are in `archive/` and are not listed here. Every figure is",
        "from full-size synthetic checkpoints (random weights) unless the file says otherwise; RTF is wall time",
        "over audio seconds (aggregate at concurrency > 1), audio-s/s its inverse.",
        "",
        f"## Serving ({len(serving)} rows)",
        "",
    ]
    lines += _table(SERVING_HEADER + PROVENANCE_HEADER, _rows(serving, SERVING_KEYS))
    lines += ["", f"## Kernels, decode steps and other metrics ({len(metrics)} rows)", ""]
    lines += _table(METRIC_HEADER + PROVENANCE_HEADER, _rows(metrics, METRIC_KEYS))
    lines += [
        "",
        f"## Files without current figures ({len(bare)})",
        "",
        "A/B comparisons and studies whose kept side was measured again since (their figures are in the",
        "newer files above), and A/Bs whose new side was not kept.",
        "",
    ]
    rows = []
    for file in bare:
        meta = file.data["meta"]
        rows.append(
            [
                f"[{file.name}]({file.name})",
                _cell(meta["what"]),
                gpu_label(meta),
                _cell(meta["gpu_count"]),
                _commit(meta, {}),
                meta["date"],
            ]
        )
    lines += _table(["file", "what", "GPU", "GPU count", "commit", "date"], rows)
    return "\n".join(lines) + "\n"


def page_paths(root: Path) -> list[Path]:
    """The pages that may hold generated blocks: README.md and docs/*.md under `root`, those that exist."""
    root = Path(root)
    return [path for path in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if path.is_file()]


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


def _page_updates(files: list[BenchFile], bench_dir: Path, pages: list[Path] | None) -> list[tuple]:
    """(page, its name as messages show it, its PageUpdate) for every page (default: page_paths of the
    benchmarks folder's parent)."""
    root = bench_dir.resolve().parent
    updates = []
    for page in page_paths(root) if pages is None else [Path(p) for p in pages]:
        prefix = Path(os.path.relpath(bench_dir.resolve(), page.resolve().parent)).as_posix()
        text = page.read_text(encoding="utf-8")
        updates.append((page, _shown(page, root), results_views.update(text, files, prefix)))
    return updates


def check(bench_dir: Path, results_path: Path | None = None, pages: list[Path] | None = None) -> list[str]:
    """What is wrong, one message each: schema errors of any JSON (archive included), then RESULTS.md, then the
    generated blocks of the pages (README.md and docs/*.md unless `pages` names others)."""
    bench_dir = Path(bench_dir)
    results_path = Path(results_path) if results_path else bench_dir / RESULTS_NAME
    files, errors = load_files(bench_dir)
    problems = [str(error) for error in errors]
    if problems:
        return problems
    expected = render(files)
    try:
        actual = results_path.read_text(encoding="utf-8")
    except OSError:
        actual = None
    try:
        shown = f"{bench_dir.name}/{results_path.relative_to(bench_dir).as_posix()}"
    except ValueError:
        shown = str(results_path)
    if actual is None:
        problems.append(f"{shown}: missing; run python scripts/benchmark_results.py --write")
    elif actual != expected:
        problems.append(
            f"{shown}: out of date with the benchmark JSON; run python scripts/benchmark_results.py --write"
        )
    for _, name, update in _page_updates(files, bench_dir, pages):
        problems += [f"{name}:{line}: {problem}" for line, problem in update.problems]
        problems += [
            f"{name}:{block.line}: block 'results: {block.spec}' is out of date with the benchmark JSON; "
            "run python scripts/benchmark_results.py --write"
            for block in update.stale
        ]
    return problems


def write(bench_dir: Path, results_path: Path | None = None, pages: list[Path] | None = None) -> list[str]:
    """Writes RESULTS.md and the pages' generated blocks; returns the problems instead (writing nothing) where a
    JSON misses the schema or a page's marker is wrong."""
    bench_dir = Path(bench_dir)
    results_path = Path(results_path) if results_path else bench_dir / RESULTS_NAME
    files, errors = load_files(bench_dir)
    if errors:
        return [str(error) for error in errors]
    updates = _page_updates(files, bench_dir, pages)
    problems = [
        f"{name}:{line}: {problem}" for _, name, update in updates for line, problem in update.problems
    ]
    if problems:
        return problems
    results_path.write_text(render(files), encoding="utf-8")
    for page, _, update in updates:
        if update.stale:
            page.write_text(update.text, encoding="utf-8")
    return []
