import math

import numpy as np
import pytest

from tritontts.bench.stats import BenchmarkRun, LatencyStats, RequestRecord, percentile, summarize

TEN = [7.0, 1.0, 10.0, 3.0, 2.0, 9.0, 4.0, 6.0, 5.0, 8.0]


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0, 1.0),
        (50, 5.5),  # rank 0.50 * 9 = 4.5: halfway between 5 and 6
        (90, 9.1),  # rank 8.1: 9 + 0.1 * (10 - 9)
        (95, 9.55),  # rank 8.55
        (99, 9.91),  # rank 8.91
        (100, 10.0),
    ],
)
def test_percentile_is_linear_interpolation_between_ranks(q, expected):
    assert percentile(TEN, q) == pytest.approx(expected)
    assert percentile(TEN, q) == pytest.approx(np.percentile(TEN, q))


def test_percentile_of_few_values():
    assert percentile([0.25], 99) == 0.25
    assert percentile([1.0, 3.0], 50) == 2.0
    assert percentile([1.0, 2.0, 4.0], 75) == pytest.approx(3.0)  # rank 1.5


def test_percentile_rejects_empty_and_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_stats():
    stats = LatencyStats.of(TEN)
    assert stats.count == 10
    assert stats.avg == pytest.approx(5.5)
    assert (stats.p50, stats.p90, stats.p95, stats.p99) == pytest.approx((5.5, 9.1, 9.55, 9.91))
    assert (stats.min, stats.max) == (1.0, 10.0)
    assert LatencyStats.of([]) is None


def test_summary_counts_errors_and_computes_overall_rtf():
    records = [
        RequestRecord("a", latency=0.5, audio_seconds=2.0, first_chunk_latency=0.1, chunks=3),
        RequestRecord("b", latency=1.5, audio_seconds=3.0, first_chunk_latency=0.3, chunks=4),
        RequestRecord("c", latency=0.0, error="model crashed"),
    ]
    summary = summarize(BenchmarkRun("streaming", 2, wall_seconds=2.5, records=records))
    assert (summary.requests, summary.succeeded, summary.failed) == (3, 2, 1)
    assert summary.errors == [{"id": "c", "error": "model crashed"}]
    assert summary.audio_seconds == 5.0
    assert summary.rtf == pytest.approx(2.5 / 5.0)
    assert summary.throughput == pytest.approx(5.0 / 2.5)
    assert summary.latency.avg == pytest.approx(1.0)
    assert summary.latency.p50 == pytest.approx(1.0)
    assert summary.first_chunk_latency.p90 == pytest.approx(0.1 + 0.9 * 0.2)
    assert records[0].rtf == pytest.approx(0.25)
    assert records[2].rtf is None


def test_summary_of_offline_run_has_no_first_chunk_and_all_failed_run_has_no_rtf():
    offline = summarize(BenchmarkRun("offline", 1, 1.0, [RequestRecord("a", 0.2, 1.0)]))
    assert offline.first_chunk_latency is None
    failed = summarize(BenchmarkRun("offline", 1, 1.0, [RequestRecord("a", 0.0, error="boom")]))
    assert failed.rtf is None and failed.throughput is None and failed.latency is None
    assert not math.isnan(failed.wall_seconds)
