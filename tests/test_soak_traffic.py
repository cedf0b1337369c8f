"""scripts/soak_traffic.py, the GPU soak's tool (docs/reliability.md, "GPU soak"): its window aggregation, verdicts,
log scan and nvidia-smi parsing without a server, then the whole tool for a few seconds against the speech API in
front of the real tritonserver (tiny synthetic Spark-TTS), attached and detached."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from openai_api_process import api_process, zh_voices
from spark_models import SPARK_SERVING, build_spark_models

from tritontts.bench.soak_load import Target, Voices, body
from tritontts.bench.soak_monitor import UNLOAD_FAULTS, Monitor, gpu_memory, scan_log
from tritontts.bench.soak_windows import KINDS, Record, Windows, flat, totals_and_verdicts
from tritontts.bench.stats import percentile
from tritontts.triton.server import free_ports

TRITON_MODELS = [build_spark_models]
REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "soak_traffic.py"  # soak_traffic.py
KEY = "soak-key"
MIB = 2**20


# --- without a server --------------------------------------------------------------------------------------


def rec(
    start: float, kind: str = "stream_saved", outcome: str = "ok", first: float | None = 100.0, target="a"
):
    return Record(start, target, kind, 200 if outcome != "error" else 500, outcome, first, 500.0, 1.0)


def test_records_fall_into_the_window_of_their_start_and_p99_interpolates():
    windows = Windows(60)
    for i in range(100):  # window 0: first chunks 1..100 ms
        windows.add(rec(i * 0.5, first=float(i + 1)))
    windows.add(rec(61, kind="offline", first=3.0))  # a whole file's first bytes are no first chunk
    windows.add(rec(62, kind="cancel", outcome="cancelled", first=7.0))
    windows.add(rec(63, kind="stream_new", outcome="error", first=None))
    series = windows.series()
    assert [w["window"] for w in series] == [0, 1] and series[1]["start_s"] == 60
    first = series[0]["first_chunk_ms"]
    assert first["count"] == 100 and first["p50"] == 50.5
    assert first["p99"] == round(percentile(list(range(1, 101)), 99), 1) == 99.0  # 99 + 0.01 * 1, rounded
    assert series[1]["requests"] == {"stream_saved": 0, "stream_new": 1, "offline": 1, "cancel": 1}
    assert series[1]["errors"] == {"stream_saved": 0, "stream_new": 1, "offline": 0, "cancel": 0}
    assert series[1]["cancelled"] == 1 and series[1]["first_chunk_ms"] == {"count": 1, "p50": 7.0, "p99": 7.0}
    assert series[1]["offline_total_ms"]["count"] == 1
    assert windows.totals == {"requests": 103, "errors": 1, "cancelled": 1}
    assert windows.last_p99() == 7.0


def test_raw_rows_are_bounded_and_errors_kept_first():
    windows = Windows(1, raw_rows=10, error_rows=3)
    for i in range(1000):
        windows.add(rec(i * 0.01, outcome="error" if i % 2 else "ok"))
    rows = windows.rows()
    assert len(rows["last"]) == 10 and rows["last"][-1]["start_s"] == 9.99
    assert [r["start_s"] for r in rows["first_errors"]] == [0.01, 0.03, 0.05]


def test_memory_samples_keep_each_window_s_largest_value():
    windows = Windows(10, end_s=20)
    windows.add_sample(1, {"tritonserver:1": 100 * MIB}, {"tritonserver:1": 500.0}, 1000.0)
    windows.add_sample(5, {"tritonserver:1": 120 * MIB, "stub:1:m_0": 10 * MIB}, {}, 900.0)
    windows.add_sample(12, {"tritonserver:1": 90 * MIB}, {}, None)
    windows.add_sample(31, {"tritonserver:1": 95 * MIB}, {}, None)  # after the end: into the last window
    w0, w1 = windows.series()
    assert w0["rss_mib"] == {"stub:1:m_0": 10.0, "tritonserver:1": 120.0} and w0["rss_total_mib"] == 130.0
    assert w0["gpu_mib"] == {"tritonserver:1": 500.0} and w0["gpu_total_mib"] == 1000.0
    assert w0["memory_samples"] == 2 and w1["memory_samples"] == 2
    assert w1["gpu_total_mib"] is None and w1["rss_total_mib"] == 95.0
    assert len(Windows(10).series()) == 0 and Windows(10, end_s=21).last == 2


def series_of(p99s: list[float | None], gpu: list[float | None], rss: list[float]) -> list[dict]:
    return [
        {
            "window": i,
            "first_chunk_ms": {"p99": p},
            "gpu_total_mib": g,
            "gpu_mib": {} if g is None else {"tritonserver:1": g},
            "rss_mib": {"tritonserver:1": r},
            "rss_total_mib": r,
        }
        for i, (p, g, r) in enumerate(zip(p99s, gpu, rss))
    ]


def test_flat_is_growth_within_the_tolerance_from_the_first_window_to_the_last():
    assert flat(100, 105, 0.05) and not flat(100, 105.1, 0.05) and flat(100, 50, 0.05)
    assert flat(None, 1, 0.05) is None and flat(0, 1, 0.05) is None

    totals, verdicts = totals_and_verdicts(
        series_of([200, 400, 240], [1000, 1200, 1040], [100, 100, 104]), 0, 0, 0
    )
    assert verdicts["zero_errors"] and verdicts["zero_stub_deaths"]
    assert verdicts["first_chunk_p99_flat"] is True  # 240 <= 200 x 1.25: the middle window does not count
    assert verdicts["gpu_memory_flat"] is True and verdicts["host_rss_flat"] is True
    assert verdicts["gpu_memory_flat_each_process"] is True and verdicts["memory_not_flat"] == []
    assert verdicts["no_fault_at_unload"] is None and "tolerance" in verdicts["rule"]
    assert totals["first_chunk_p99_ms"] == {
        "first": 200,
        "last": 240,
        "first_window": 0,
        "last_window": 2,
        "growth": 0.2,
    }
    assert totals["gpu_total_mib"]["growth"] == 0.04 and totals["rss_mib"]["tritonserver:1"]["growth"] == 0.04

    _, verdicts = totals_and_verdicts(
        series_of([200, 260, None], [1000, 1100, 1060], [100, 100, 110]), 2, 1, 0
    )
    assert not verdicts["zero_errors"] and not verdicts["zero_stub_deaths"]
    assert verdicts["first_chunk_p99_flat"] is False  # the last window with a p99 is window 1
    assert verdicts["gpu_memory_flat"] is False and verdicts["host_rss_flat"] is False
    assert verdicts["gpu_memory_flat_each_process"] is False
    assert verdicts["memory_not_flat"] == ["GPU tritonserver:1: +6.0%", "host tritonserver:1: +10.0%"]
    assert verdicts["memory_still_growing"] == ["host tritonserver:1: +10.0% over the last third"]  # GPU fell
    _, verdicts = totals_and_verdicts(series_of([200, 200], [None, None], [100, 100]), 0, 0, 3)
    assert verdicts["gpu_memory_flat"] is None and verdicts["zero_stub_deaths"] is False  # 3 log faults
    assert verdicts["gpu_memory_flat_each_process"] is None


def test_memory_that_levels_off_is_not_flat_but_not_still_growing():
    """The high-water mark reached early (a cache filling) against growth that goes on to the end (a leak): both
    fail the flat rule; only the second is still growing over the last third."""
    levelled = [1000, 1100, 1200, 1300, 1300, 1300, 1310]
    leaking = [1000, 1050, 1100, 1150, 1200, 1250, 1300]
    for gpu, grown, still in (
        (levelled, "+31.0%", []),
        (leaking, "+30.0%", ["GPU tritonserver:1: +8.3% over the last third"]),  # from window 4 on
    ):
        _, verdicts = totals_and_verdicts(series_of([100] * 7, gpu, [100] * 7), 0, 0, 0)
        assert verdicts["gpu_memory_flat"] is False
        assert verdicts["memory_not_flat"] == [f"GPU tritonserver:1: {grown}"]
        assert verdicts["memory_still_growing"] == still
    _, verdicts = totals_and_verdicts(series_of([100, 100], [1000, 1200], [100, 100]), 0, 0, 0)
    assert verdicts["memory_still_growing"] == []  # two windows: no last third to judge


def test_scan_log_counts_stub_faults_from_an_offset(tmp_path: Path):
    log = tmp_path / "tritonserver.log"
    early = "E1 Stub process 'm_0_0' is not healthy.\n"
    log.write_text(
        early
        + "ok\nSegmentation fault (core dumped)\nSignal (11) received.\nStub process 'x' is not healthy\n"
    )
    everything = scan_log(log)
    assert everything["counts"] == {"stub_not_healthy": 2, "segmentation_fault": 1, "signal": 1}
    assert everything["size"] == log.stat().st_size and len(everything["lines"]) == 4
    later = scan_log(log, len(early))
    assert later["counts"]["stub_not_healthy"] == 1 and later["from_byte"] == len(early)
    assert scan_log(tmp_path / "missing.log")["counts"]["segmentation_fault"] == 0


def test_the_unload_scan_ignores_the_stops_own_signal_and_counts_an_expired_exit_timeout(tmp_path: Path):
    log = tmp_path / "tritonserver.log"
    log.write_text(
        "Signal (15) received.\nSignal (2) received.\nSignal (6) received.\n"
        'E1128 main.cc:535] "failed to stop server: Internal - Exit timeout expired. Exiting immediately."\n'
        "Fatal Python error: Segmentation fault\n"
    )
    counts = scan_log(log, 0, UNLOAD_FAULTS)["counts"]
    assert counts == {"stub_not_healthy": 0, "segmentation_fault": 1, "signal": 1, "exit_timeout": 1}
    assert scan_log(log)["counts"]["signal"] == 3  # while serving, any signal stopped a server


def test_gpu_memory_from_nvidia_smi_csv_and_none_without_it(tmp_path: Path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        '#!/bin/sh\ncase "$1" in --query-compute-apps*) printf "123, 1500\\n456, 20\\n123, 10\\n";; '
        '*) printf "2048\\n";; esac\n'
    )
    smi.chmod(0o755)
    assert gpu_memory(str(smi)) == ({123: 1510.0, 456: 20.0}, 2048.0)
    assert gpu_memory(None) == ({}, None)
    assert gpu_memory(str(tmp_path / "gone")) == ({}, None)
    sample = Monitor(server_pids=[os.getpid()], smi=str(smi)).sample()  # not a tritonserver: no stubs
    assert sample.rss[f"tritonserver:{os.getpid()}"] > 0 and sample.gpu == {
        "pid:123": 1510.0,
        "pid:456": 20.0,
    }


def test_targets_and_request_bodies():
    target = Target.parse("spark=http://127.0.0.1:8080/,spark-tts")
    assert (target.name, target.url, target.model) == ("spark", "http://127.0.0.1:8080", "spark-tts")
    assert Target.parse("cosyvoice2=http://h:1").model == "cosyvoice2"
    with pytest.raises(ValueError):
        Target.parse("http://h:1")
    voices = Voices("zh", b"RIFF", "text")
    assert body(target, "stream_new", voices, "Hi.") == {
        "model": "spark-tts",
        "input": "Hi.",
        "response_format": "pcm",
        "stream_format": "audio",
        "ref_audio": "UklGRg==",
        "ref_text": "text",
    }
    assert body(target, "offline", voices, "Hi.")["voice"] == "zh" and "stream_format" not in body(
        target, "offline", voices, "Hi."
    )
    assert body(target, "cancel", voices, "Hi.")["stream_format"] == "audio"


# --- against the API on the real tritonserver --------------------------------------------------------------


@pytest.fixture(scope="module")
def spark_api(triton, prompt_zh, tmp_path_factory):
    server = triton.load(*SPARK_SERVING)
    voices = zh_voices(tmp_path_factory.mktemp("soak_voices"), prompt_zh, PROMPT_ZH_TEXT)
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices), "--api-key", KEY]
    args += ["--max-new-tokens=60", "--model", "spark-tts=spark_tts,spark_tts_offline"]  # streams of 2 chunks
    with api_process(*args, log_file=tmp_path_factory.mktemp("soak_api") / "api.log") as url:
        yield server, url


@pytest.fixture(scope="module")
def reference(prompt_zh, tmp_path_factory) -> Path:
    wav, rate = soundfile.read(prompt_zh, dtype="float32")
    path = tmp_path_factory.mktemp("soak_ref") / "ref.wav"
    soundfile.write(path, wav[: 3 * rate], rate)
    return path


def soak_args(server, url: str, reference: Path, output: Path, seconds: float, window: float) -> list[str]:
    """A model not ready within 60 s fails the soak with its last /health answer, inside the tests' timeouts."""
    return [
        *("--target", f"spark={url},spark-tts", "--concurrency", "2", "--seconds", str(seconds)),
        *("--window", str(window), "--sample-every", "1", "--server-pid", str(server.server.pid)),
        *("--server-log", str(server.server.config.log_file), "--voice", "soakvoice", "--api-key", KEY),
        *("--wait-ready", "60"),
        *(
            "--reference-wav",
            str(reference),
            "--reference-text",
            PROMPT_ZH_TEXT[:20],
            "--output",
            str(output),
        ),
    ]


def run_tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    )
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.mark.slow
def test_soak_traffic_on_the_tiny_spark_api(spark_api, reference, tmp_path: Path):
    server, url = spark_api
    out = tmp_path / "soak.json"
    done = run_tool(*soak_args(server, url, reference, out, 15, 5), "--label", "CPU test")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())

    assert result["finished"] and result["meta"]["label"] == "CPU test"
    assert result["meta"]["device"].startswith("CPU") or "NVIDIA" in result["meta"]["device"]
    assert result["meta"]["commit"] and "--concurrency 2" in result["meta"]["command"]
    assert result["targets"] == [{"name": "spark", "url": url, "model": "spark-tts", "sample_rate": 16000}]
    assert result["load"]["prepared"] == {"spark": {"voice": "soakvoice", "added": True}}
    assert result["load"]["warmup_errors"] == 0 and len(result["load"]["warmup"]) == len(KINDS)
    totals, series = result["totals"], result["series"]
    assert totals["errors"] == 0, result["rows"]["first_errors"]
    done_by_kind = {k: sum(w["requests"][k] for w in series) for k in KINDS}
    assert all(done_by_kind.values()), done_by_kind
    assert totals["cancelled"] == done_by_kind["cancel"] > 0  # cancellations are not errors
    rows = result["rows"]["last"]
    assert {r["outcome"] for r in rows if r["kind"] == "cancel"} == {"cancelled"}
    streamed = [r for r in rows if r["kind"] in ("stream_saved", "stream_new")]
    assert all(r["first_chunk_ms"] < r["total_ms"] and r["audio_s"] == 60 * 320 / 16000 for r in streamed)

    assert [w["window"] for w in series] == [
        0,
        1,
        2,
    ]  # 15 s in windows of 5 s; the tail's samples in the last
    assert series[0]["first_chunk_ms"]["p99"] > 0 and all(w["memory_samples"] >= 3 for w in series)
    for w in series:  # streams only: a whole file's first bytes are no first chunk
        assert (
            w["first_chunk_ms"]["count"]
            == w["requests"]["stream_saved"] + w["requests"]["stream_new"] + w["cancelled"]
        )
    labels = set().union(*(w["rss_mib"] for w in series))
    pid = server.server.pid
    assert f"tritonserver:{pid}" in labels
    stubs = {label for label in labels if label.startswith(f"stub:{pid}:")}
    assert {"spark_tts", "spark_tts_offline", "audio_tokenizer", "vocoder"} <= {
        result["monitor"]["processes"][s]["model"] for s in stubs
    }
    assert all(series[-1]["rss_mib"][label] > 0 for label in {f"tritonserver:{pid}", *stubs})
    assert result["monitor"]["stub_deaths"] == 0 and totals["stub_deaths"] == 0
    stub = result["monitor"]["processes"][next(iter(stubs))]
    assert stub["binary"].endswith("triton_python_backend_stub")
    assert stub["sha256"] == hashlib.sha256(Path(stub["binary"]).read_bytes()).hexdigest()[:16]
    verdicts = result["verdicts"]
    assert verdicts["zero_errors"] and verdicts["zero_stub_deaths"]
    assert (
        verdicts["gpu_memory_flat"] is None or "NVIDIA" in result["meta"]["device"]
    )  # no nvidia-smi: not judged
    assert verdicts["first_chunk_p99_flat"] in (True, False)  # judged (a loaded 2-core CPU decides which)
    assert result["server_logs"][0]["counts"] == {"stub_not_healthy": 0, "segmentation_fault": 0, "signal": 0}

    after = run_tool("--after-stop", "--output", str(out), "--server-log", str(server.server.config.log_file))
    assert after.returncode == 0 and "faults at unload: 0" in after.stdout, after.stderr
    assert json.loads(out.read_text())["verdicts"]["no_fault_at_unload"] is True


@pytest.mark.slow
def test_detached_soak_and_its_status(spark_api, reference, tmp_path: Path):
    server, url = spark_api
    out = tmp_path / "detached" / "soak.json"
    started = time.monotonic()
    done = run_tool(*soak_args(server, url, reference, out, 6, 2), "--detach", timeout=60)
    assert done.returncode == 0 and "running in the background" in done.stdout, done.stderr
    assert time.monotonic() - started < 30  # returned before the run's end
    status = run_tool("--status", "--output", str(out), timeout=30)
    assert status.returncode == 0 and status.stdout.startswith("state: "), status.stderr
    deadline = time.monotonic() + 240
    while "state: done" not in status.stdout and time.monotonic() < deadline:
        assert "died" not in status.stdout and "failed" not in status.stdout, (
            out.parent / "soak.json.log"
        ).read_text()
        time.sleep(1)
        status = run_tool("--status", "--output", str(out), timeout=30)
    assert "state: done" in status.stdout and "errors 0" in status.stdout, status.stdout
    assert "last window's first-chunk p99" in status.stdout and "None ms" not in status.stdout
    result = json.loads(out.read_text())
    assert result["finished"] and result["totals"]["requests"] > 0 and result["totals"]["errors"] == 0
    assert "detached" in (out.parent / "soak.json.log").read_text()
    assert run_tool("--status", "--output", str(tmp_path / "none.json")).returncode == 1


def test_no_target_is_a_usage_error_and_a_dead_one_fails_after_the_wait(tmp_path: Path):
    done = run_tool("--seconds", "1", timeout=60)
    assert done.returncode == 2 and "--target" in done.stderr
    (port,) = free_ports(1)
    out = tmp_path / "dead.json"
    args = (
        "--target",
        f"x=http://127.0.0.1:{port}",
        "--wait-ready",
        "2",
        "--output",
        str(out),
        "--no-warmup",
    )
    done = run_tool(*args, "--kinds", "offline", timeout=60)
    assert done.returncode == 1 and "not ready after 2.0 s" in done.stderr, done.stderr[-2000:]
    assert "state: failed" in run_tool("--status", "--output", str(out), timeout=30).stdout
