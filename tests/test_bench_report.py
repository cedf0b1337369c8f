import json

import pytest

from tritontts.bench.report import TABLE_COLUMNS, markdown_table, write_report
from tritontts.bench.stats import BenchmarkRun, RequestRecord

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_runs() -> list[BenchmarkRun]:
    offline = BenchmarkRun(
        "offline", 1, 2.0, [RequestRecord("a", 0.8, 4.0, chunks=1), RequestRecord("b", 1.2, 6.0, chunks=1)]
    )
    streaming = BenchmarkRun(
        "streaming",
        4,
        1.0,
        [
            RequestRecord("a", 0.9, 4.0, first_chunk_latency=0.2, chunks=3),
            RequestRecord("b", 1.1, 6.0, first_chunk_latency=0.4, chunks=4),
            RequestRecord("c", 0.0, error="timeout"),
        ],
    )
    return [offline, streaming]


def test_markdown_table_has_upstream_columns_and_one_row_per_run():
    lines = markdown_table(make_runs()).strip().splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == list(TABLE_COLUMNS)
    for column in ("Mode", "Concurrency", "Avg Latency", "First Chunk Latency (P50)", "RTF"):
        assert column in header
    assert len(lines) == 4
    offline = [cell.strip() for cell in lines[2].strip("|").split("|")]
    streaming = [cell.strip() for cell in lines[3].strip("|").split("|")]
    row = dict(zip(header, offline))
    assert row["Mode"] == "Offline" and row["Concurrency"] == "1"
    assert row["Avg Latency"] == "1000.00 ms"
    assert row["First Chunk Latency (P50)"] == "-"
    assert row["RTF"] == "0.2000"
    row = dict(zip(header, streaming))
    assert row["Errors"] == "1"
    assert row["First Chunk Latency (P50)"] == "300.00 ms"
    assert row["RTF"] == "0.1000"


def test_write_report_writes_json_markdown_and_png(tmp_path):
    paths = write_report(make_runs(), tmp_path / "log", {"model_name": "spark_tts"})
    summary = json.loads(paths["json"].read_text())
    assert summary["model_name"] == "spark_tts"
    assert [run["mode"] for run in summary["runs"]] == ["offline", "streaming"]
    streaming = summary["runs"][1]
    assert streaming["failed"] == 1 and streaming["errors"] == [{"id": "c", "error": "timeout"}]
    assert streaming["latency"]["p50"] == pytest.approx(1.0)
    assert len(streaming["records"]) == 3 and streaming["records"][0]["rtf"] == pytest.approx(0.225)
    assert paths["markdown"].read_text().startswith("| Mode |")

    data = paths["plot"].read_bytes()
    assert data[:8] == PNG_SIGNATURE
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image

    image = matplotlib.image.imread(paths["plot"])
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_report_of_offline_only_runs(tmp_path):
    paths = write_report(make_runs()[:1], tmp_path)
    assert paths["plot"].read_bytes()[:8] == PNG_SIGNATURE


def test_offline_runs_plot_latency_against_audio_instead_of_first_chunks(tmp_path):
    """An offline run has no first chunk: its right panel draws every successful request's latency against
    its audio duration; with streaming results it is the first-chunk histogram."""
    from tritontts.bench.report import plot_latencies

    offline = make_runs()[:1]
    drawn = plot_latencies(offline, tmp_path / "offline.png")
    assert drawn == {"Latency CDF": 2, "Latency vs audio duration": 2}
    drawn = plot_latencies(make_runs(), tmp_path / "both.png")
    assert drawn == {"Latency CDF": 4, "First-chunk latency (streaming)": 2}
    assert (tmp_path / "offline.png").read_bytes()[:8] == PNG_SIGNATURE
