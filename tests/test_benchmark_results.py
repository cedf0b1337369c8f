"""benchmarks/RESULTS.md and the schema of benchmarks/*.json (tritontts/bench/results.py, scripts/benchmark_results.py).

The check passes on the repository as it is; a JSON missing a meta field fails naming the file and the field; an
out-of-date RESULTS.md fails; the tables hold one row per headline row of the files not archived. CPU only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from benchmark_files import METRIC, SERVING, run_script, write_json

from tritontts.bench import results

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"

META = {
    "device": "NVIDIA H100 80GB HBM3",
    "gpu_count": 1,
    "date": "2026-11-27",
    "commit": "0123abc",
    "command": "bash run.sh 4 4 streaming --num_tasks 1",
    "what": "a test file",
}


@pytest.fixture
def bench(tmp_path: Path) -> Path:
    """A benchmarks folder of three files (one archived) and its RESULTS.md, written."""
    folder = tmp_path / "benchmarks"
    write_json(
        folder / "a.json", {"meta": META, "headline": [SERVING, dict(SERVING, concurrency=16)], "runs": []}
    )
    write_json(folder / "b.json", {"meta": dict(META, command=["x", "y"]), "headline": [METRIC], "table": {}})
    write_json(folder / "archive" / "old.json", {"meta": META, "headline": [dict(SERVING, rtf=0.5)]})
    assert results.write(folder) == []
    return folder


def test_check_passes_on_the_repository():
    done = run_script("--check")
    assert done.returncode == 0, done.stderr
    assert results.check(BENCHMARKS) == []


def test_every_repository_json_has_the_schema_and_the_archive_is_left_out():
    files, errors = results.load_files(BENCHMARKS)
    assert errors == []
    assert len(files) == len(results.benchmark_paths(BENCHMARKS)) > 50
    assert any(f.archived for f in files) and any(not f.archived for f in files)
    text = (BENCHMARKS / results.RESULTS_NAME).read_text()
    for file in files:
        assert (f"]({file.name})" in text) != file.archived, file.name


def test_a_missing_meta_field_fails_naming_the_file_and_the_field(bench: Path):
    data = json.loads((bench / "a.json").read_text())
    del data["meta"]["commit"]
    write_json(bench / "a.json", data)
    done = run_script("--check", "--benchmarks", str(bench))
    assert done.returncode == 1
    assert "benchmarks/a.json: meta.commit: missing" in done.stderr


def test_an_archived_json_is_checked_too(bench: Path):
    data = json.loads((bench / "archive" / "old.json").read_text())
    data["meta"]["date"] = "27.11.2026"
    data["headline"][0]["rtf"] = "fast"
    write_json(bench / "archive" / "old.json", data)
    problems = results.check(bench)
    assert "benchmarks/archive/old.json: meta.date: must be a date YYYY-MM-DD, got '27.11.2026'" in problems
    assert "benchmarks/archive/old.json: headline[0].rtf: must be a finite number or null" in problems


def test_a_file_without_meta_or_headline_fails(bench: Path):
    write_json(bench / "c.json", {"runs": []})
    problems = results.check(bench)
    assert "benchmarks/c.json: meta: missing" in problems
    assert any(p.startswith("benchmarks/c.json: headline: missing") for p in problems)


def test_malformed_rows_and_meta_are_named():
    data = {
        "meta": dict(META, gpu_count=-1, commit="HEAD", extra=1),
        "headline": [
            dict(SERVING, concurrency=0, speed=1),
            {k: v for k, v in METRIC.items() if k != "unit"},
            dict(SERVING, first_chunk_p50_ms=None, first_chunk_p99_ms=None, rtf=None, audio_s_per_s=None),
        ],
    }
    fields = {e.field for e in results.validate(data, "x.json")}
    assert {
        "meta.gpu_count",
        "meta.commit",
        "meta.extra",
        "headline[0].concurrency",
        "headline[0].speed",
        "headline[1].unit",
        "headline[2].rtf",
    } <= fields
    assert results.validate({"meta": META, "headline": [SERVING, METRIC]}, "x.json") == []


def test_an_out_of_date_results_md_fails(bench: Path):
    assert results.check(bench) == []
    data = json.loads((bench / "b.json").read_text())
    data["headline"][0]["value"] = 0.5
    write_json(bench / "b.json", data)
    done = run_script("--check", "--benchmarks", str(bench))
    assert done.returncode == 1
    assert "RESULTS.md: out of date" in done.stderr and "--write" in done.stderr
    assert run_script("--write", "--benchmarks", str(bench)).returncode == 0
    assert run_script("--check", "--benchmarks", str(bench)).returncode == 0


def test_a_missing_results_md_fails(bench: Path):
    (bench / results.RESULTS_NAME).unlink()
    assert any("RESULTS.md: missing" in p for p in results.check(bench))


def table_rows(text: str, heading: str) -> list[str]:
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ")][1:]


def test_one_table_row_per_headline_row(bench: Path):
    text = (bench / results.RESULTS_NAME).read_text()
    serving, metrics = table_rows(text, "Serving"), table_rows(text, "Kernels")
    assert len(serving) == 2 and len(metrics) == 1
    assert [row.split(" | ")[3] for row in serving] == ["1", "16"]
    assert "0.0481" in serving[0] and "`x ; y`" in metrics[0] and "[b.json](b.json)" in metrics[0]
    assert "0.5" not in "".join(serving), "an archived file's rows are not listed"


def test_a_full_commit_is_shown_as_git_abbreviates_it(tmp_path: Path):
    folder = tmp_path / "benchmarks"
    full = "4114b703bbcd558f997201efde0e5db38a6cd19d"
    write_json(folder / "a.json", {"meta": dict(META, commit=full), "headline": [SERVING]})
    assert results.write(folder) == []
    (row,) = table_rows((folder / results.RESULTS_NAME).read_text(), "Serving")
    assert " | 4114b70 | " in row and full not in row


def test_the_repository_tables_hold_every_headline_row():
    files, _ = results.load_files(BENCHMARKS)
    current = [f for f in files if not f.archived]
    serving = sum(1 for f in current for row in f.data["headline"] if "metric" not in row)
    metrics = sum(1 for f in current for row in f.data["headline"] if "metric" in row)
    text = (BENCHMARKS / results.RESULTS_NAME).read_text()
    assert len(table_rows(text, "Serving")) == serving > 0
    assert len(table_rows(text, "Kernels")) == metrics > 0
    bare = [f for f in current if not f.data["headline"]]
    assert len(table_rows(text, "Files without")) == len(bare)


def test_write_refuses_files_that_miss_the_schema(tmp_path: Path):
    folder = tmp_path / "benchmarks"
    shutil.copytree(BENCHMARKS, folder, ignore=shutil.ignore_patterns("*.md"))
    write_json(folder / "new.json", {"meta": META})
    problems = results.write(folder)
    assert problems and all(p.startswith("benchmarks/new.json: headline") for p in problems)
    assert not (folder / results.RESULTS_NAME).exists()
