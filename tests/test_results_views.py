"""The generated figure blocks of README.md and docs/*.md (tritontts/bench/results_views.py): --write fills them
from the benchmark JSON, --check names the page, line and block that is stale or whose marker is wrong. CPU only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_files import METRIC, run_script, write_json
from benchmark_files import SERVING as ROW

from tritontts.bench import results, results_views

REPO = Path(__file__).resolve().parents[1]

META = {
    "device": "NVIDIA H100 80GB HBM3",
    "gpu_count": 1,
    "date": "2026-11-27",
    "commit": "0123abc",
    "command": "bash run.sh 4 4 streaming",
    "what": "a test file",
}


def block(spec: str) -> str:
    return f"<!-- results: {spec} -->\n<!-- /results -->\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """benchmarks/ with two files, a README.md and docs/page.md with a block each, all written."""
    bench = tmp_path / "benchmarks"
    write_json(
        bench / "a.json",
        {
            "meta": META,
            "headline": [
                ROW,
                dict(ROW, concurrency=16, first_chunk_p50_ms=219.6, audio_s_per_s=74.12, note="first pass"),
                dict(ROW, concurrency=16, first_chunk_p50_ms=242.4, audio_s_per_s=77.55, note="second pass"),
            ],
        },
    )
    write_json(bench / "b.json", {"meta": dict(META, date="2026-11-20"), "headline": [METRIC]})
    (tmp_path / "README.md").write_text("# x\n\n" + block("streaming gpu=H100") + "\nend\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# p\n\n" + block("metrics file=b.json") + "\n")
    assert results.write(bench) == []
    return tmp_path


def test_the_repository_pages_hold_blocks_and_are_current():
    pages = {p.name: p.read_text() for p in results.page_paths(REPO)}
    assert "<!-- results: streaming " in pages["README.md"]
    assert sum("<!-- results: " in text for text in pages.values()) >= 5
    done = run_script("--check")
    assert done.returncode == 0, done.stderr


def test_write_fills_the_blocks_with_links_relative_to_each_page(root: Path):
    readme = (root / "README.md").read_text()
    assert "| Spark-TTS | H100 | one tritonserver | 63.0 | – | 219.6 / 242.4 | 77.55 (c=16) |" in readme
    assert "[a.json](benchmarks/a.json)" in readme and readme.endswith("<!-- /results -->\n\nend\n")
    page = (root / "docs" / "page.md").read_text()
    assert "| decode step, batch 1 | 0.798 ms |" in page
    assert "spark_tts LLM, H100: [b.json](../benchmarks/b.json)." in page
    assert results.check(root / "benchmarks") == []


def test_a_stale_block_fails_naming_the_page_and_the_block_and_write_fixes_it(root: Path):
    data = json.loads((root / "benchmarks" / "b.json").read_text())
    data["headline"][0]["value"] = 0.5
    write_json(root / "benchmarks" / "b.json", data)
    assert run_script("--write", "--benchmarks", str(root / "benchmarks")).returncode == 0
    page = root / "docs" / "page.md"
    page.write_text(page.read_text().replace("0.5 ms", "0.4 ms"))
    done = run_script("--check", "--benchmarks", str(root / "benchmarks"))
    assert done.returncode == 1
    assert "docs/page.md:3: block 'results: metrics file=b.json' is out of date" in done.stderr
    assert "README.md" not in done.stderr
    assert run_script("--write", "--benchmarks", str(root / "benchmarks")).returncode == 0
    assert "| decode step, batch 1 | 0.5 ms |" in page.read_text()
    assert run_script("--check", "--benchmarks", str(root / "benchmarks")).returncode == 0


def test_a_hand_edited_body_is_stale_too(root: Path):
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("| 63.0 |", "| 60.0 |"))
    assert results.check(root / "benchmarks") == [
        "README.md:3: block 'results: streaming gpu=H100' is out of date with the benchmark JSON; "
        "run python scripts/benchmark_results.py --write"
    ]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nosuch gpu=H100", "unknown view 'nosuch' (views: streaming, scale_out, engine, serving, metrics)"),
        ("streaming gpu=H100 colour=red", "view 'streaming': unknown argument 'colour=red'"),
        ("streaming", "view 'streaming': missing argument gpu"),
        ("streaming gpu=H100 c=one", "view 'streaming': c must be integers >= 1"),
        ("metrics file=missing.json", "argument 'file': no benchmark file 'missing.json'"),
        ("serving file=a.json model=cosyvoice3", "selects no headline rows"),
    ],
)
def test_a_bad_marker_fails_naming_the_page_line_and_view_and_write_refuses(
    root: Path, spec: str, problem: str
):
    page = root / "docs" / "page.md"
    before = page.read_text() + "\n" + block(spec)
    page.write_text(before)
    line = before.splitlines().index(f"<!-- results: {spec} -->") + 1
    problems = results.check(root / "benchmarks")
    assert len(problems) == 1 and problems[0].startswith(f"docs/page.md:{line}: block 'results: {spec}': ")
    assert problem in problems[0]
    done = run_script("--write", "--benchmarks", str(root / "benchmarks"))
    assert done.returncode == 1 and problem in done.stderr
    assert page.read_text() == before


def test_unclosed_and_stray_markers_fail(root: Path):
    page = root / "docs" / "page.md"
    page.write_text("<!-- results: metrics file=b.json -->\ntext\n\n<!-- /results -->\n<!-- /results -->\n")
    problems = results.check(root / "benchmarks")
    assert problems[0] == "docs/page.md:5: <!-- /results --> without an opening <!-- results: VIEW -->"
    assert problems[1].startswith("docs/page.md:1: block 'results: metrics file=b.json' is out of date")
    page.write_text("<!-- results: metrics file=b.json -->\ntext\n")
    assert results.check(root / "benchmarks") == [
        "docs/page.md:1: <!-- results: metrics file=b.json --> is not closed by <!-- /results -->"
    ]


def test_markers_in_code_fences_are_left_alone(root: Path):
    page = root / "docs" / "page.md"
    text = "```markdown\n" + block("nosuch") + "```\n"
    page.write_text(text)
    assert results.check(root / "benchmarks") == []
    assert results.write(root / "benchmarks") == []
    assert page.read_text() == text


def test_the_streaming_view_takes_the_setup_with_the_lowest_first_chunk(root: Path):
    slower = dict(ROW, layout="one tritonserver, MPS", first_chunk_p50_ms=90.0, audio_s_per_s=99.0)
    write_json(root / "benchmarks" / "c.json", {"meta": dict(META, date="2026-12-01"), "headline": [slower]})
    files, _ = results.load_files(root / "benchmarks")
    lines = results_views.render_view("streaming gpu=H100,H200 c=1,16", files, "benchmarks")
    rows = [line for line in lines if line.startswith("| Spark-TTS")]
    assert rows == [
        "| Spark-TTS | H100 | one tritonserver | 63.0 | 219.6 / 242.4 | 77.55 (c=16) | [a.json](benchmarks/a.json) |"
    ]


def test_the_listing_views_move_shared_columns_under_the_table(root: Path):
    files, _ = results.load_files(root / "benchmarks")
    lines = results_views.render_view("serving file=a.json", files, "..")
    assert lines[1] == "| concurrency | first chunk p50 ms | p99 ms | RTF | audio-s/s | note |"
    assert lines[3] == "| 1 | 63.0 | 98.5 | 0.0481 | 20.81 | – |"
    lines = results_views.render_view("serving file=a.json c=16", files, "..")
    assert lines[1] == "| first chunk p50 ms | p99 ms | RTF | audio-s/s | note |"
    assert lines[-2] == "spark_tts, one tritonserver, streaming, H100, c=16: [a.json](../a.json)."
    lines = results_views.render_view("serving file=a.json c=1", files, "..")
    assert lines[-2] == "spark_tts, one tritonserver, streaming, H100, c=1: [a.json](../a.json)."
