"""run.sh stage 11, the benchmark suite, on this CPU: one serving part (Spark-TTS streaming at c=1 over a 4-row
dataset, synthetic-tiny, the torch LLM) writes a benchmark JSON of the schema and RESULTS.md into its own output
folder; a second run skips it; `--suite_detach true` runs in the background and `--suite_status true
--suite_wait` reports it; a part that fails is reported with its log's tail and the next part still runs (the
scripts swapped for stand-ins, in process); --help lists the options. Also the part selection, the state
markers and the raw-to-headline conversions of the GPU parts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritontts.bench import results, suite, suite_rows, suite_websocket
from tritontts.bench.suite_state import SuiteState
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
SPARK_JSON = "suite_spark_tts_streaming_cpu_tiny_synthetic.json"
META = {
    "device": "test",
    "gpu_count": 0,
    "date": "2026-01-01",
    "commit": "0123abc",
    "command": "test",
    "what": "test",
}


def run_sh(home: Path, ports: list[int], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    command = ["bash", "run.sh", *args, "--exp_dir", str(home / "exp"), "--python", sys.executable]
    command += ["--http_port", str(ports[0]), "--grpc_port", str(ports[1]), "--metrics_port", str(ports[2])]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def suite_args(home: Path, dataset: Path) -> list[str]:
    return [
        "11",
        "11",
        "--suite_parts",
        "spark_tts:streaming",
        "--suite_sweep",
        "1",
        "--suite_warmup",
        "0",
        "--model_source",
        "synthetic-tiny",
        "--llm_backend",
        "torch",
        "--dataset",
        str(dataset),
        "--suite_out_dir",
        str(home / "out"),
    ]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, bench_data):
    home = tmp_path_factory.mktemp("suite")
    ports = free_ports(3)
    try:
        done = run_sh(home, ports, *suite_args(home, bench_data))
    finally:
        run_sh(home, ports, "stop", "--model", "spark_tts", timeout=120)
    return home, ports, done


@pytest.mark.slow
@pytest.mark.triton
def test_a_serving_part_writes_a_schema_json_and_results_md(first_run):
    home, _, done = first_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((home / "out" / SPARK_JSON).read_text())
    assert results.validate(data, SPARK_JSON) == []
    assert data["meta"]["gpu_count"] == 0 and data["suite"]["part"] == "spark_tts:streaming"
    (row,) = data["headline"]
    assert (row["model"], row["layout"], row["mode"], row["concurrency"]) == (
        "spark_tts",
        "one tritonserver",
        "streaming",
        1,
    )
    assert row["first_chunk_p50_ms"] > 0 and row["rtf"] > 0 and row["audio_s_per_s"] > 0
    assert any(c.startswith("bash run.sh 0 3 streaming --model spark_tts") for c in data["meta"]["command"])
    assert data["raw"]["runs"][0]["succeeded"] == 4
    assert results.check(home / "out") == []  # RESULTS.md regenerated from the JSON
    assert "spark_tts:streaming  done" in (home / "exp" / "suite" / "status.txt").read_text()
    server_log = home / "exp" / "suite" / "parts" / "spark_tts_streaming" / "server.log"
    assert "successfully loaded 'spark_tts'" in server_log.read_text()  # the start's own log, kept


@pytest.mark.slow
@pytest.mark.triton
def test_a_second_run_skips_the_done_part_and_detach_and_status_report_it(first_run, bench_data):
    home, ports, done = first_run
    assert done.returncode == 0, done.stderr[-3000:]
    written = (home / "out" / SPARK_JSON).stat().st_mtime_ns
    again = run_sh(home, ports, *suite_args(home, bench_data), timeout=120)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "spark_tts:streaming: done already, skipped" in again.stdout

    detached = run_sh(home, ports, *suite_args(home, bench_data), "--suite_detach", "true", timeout=60)
    assert detached.returncode == 0, detached.stdout + detached.stderr
    assert "in the background" in detached.stdout  # running, or (nothing left to do) ended already
    status = run_sh(
        home,
        ports,
        *suite_args(home, bench_data),
        "--suite_status",
        "true",
        "--suite_wait",
        "120",
        timeout=180,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert "runner: not running" in status.stdout and "1 of 1 parts done, 0 failed" in status.stdout
    log = (home / "exp" / "suite" / "suite.log").read_text()
    assert "detached:" in log and "spark_tts:streaming: done already, skipped" in log
    assert (home / "out" / SPARK_JSON).stat().st_mtime_ns == written


ENGINE_RAW = {
    "dtype": "fp32",
    "settings": {"tiny": True, "compile": False, "graphs_captured": False, "prompt_len": 32},
    "ours": {
        "first_token": {"prefill_plus_first_step_ms_graph": 4.2},
        "batch_1": {"decode_ms_per_step_median": 1.5},
        "batch_4": {"decode_ms_per_step_median": 2.5},
    },
    "transformers_generate": {"batch_1": {"decode_ms_per_step": 30.0}},
    "reference": {"batch_1": {"decode_ms_per_step_median": 2.0}},
    "checks": {"speedup_batch_1": 12.34},
}
VOCODER_RAW = {
    "cuda_graphs": True,
    "rows": [{"model": "cosyvoice2 HiFT", "mel_frames": 42, "eager_ms": 15.2, "graphed_ms": 3.4}],
}
FAKE_SCRIPT = (
    "import json, sys\n"
    "if 'boom' in sys.argv: print('boom: this part cannot run here'); sys.exit(3)\n"
    "out = sys.argv[sys.argv.index('--out' if '--out' in sys.argv else '--output') + 1]\n"
    "json.dump(json.loads(sys.argv[1]), open(out, 'w'))\n"
)


def test_a_failed_part_is_reported_with_its_log_tail_and_the_next_part_runs(tmp_path, monkeypatch):
    raws = {"bench_llm.py": ENGINE_RAW, "bench_vocoder_graphs.py": VOCODER_RAW}
    broken = {"bench_llm.py"}

    def stand_in(self, script: str, *args: str) -> list[str]:
        return [sys.executable, "-c", FAKE_SCRIPT, json.dumps(raws[script]), *args] + (
            ["boom"] if script in broken else []
        )

    monkeypatch.setattr(suite.Runner, "python_script", stand_in)
    config = suite.SuiteConfig(
        exp_dir=tmp_path / "exp",
        out_dir=tmp_path / "out",
        parts=suite.select_parts("engine,vocoder_graphs"),
        commit="0123abc",
    )
    assert suite.Runner(config, echo=lambda line: None).run() == 1
    status = subprocess.run(
        [sys.executable, "scripts/gpu_suite.py", "status", "--exp-dir", str(tmp_path / "exp")]
        + ["--parts", "engine,vocoder_graphs", "--commit", "0123abc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert status.returncode == 1, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert any(line.startswith("engine ") and " failed " in line for line in lines), status.stdout
    assert any(line.startswith("vocoder_graphs ") and " done " in line for line in lines), status.stdout
    assert "--- engine failed: exit 3" in status.stdout
    assert "boom: this part cannot run here" in status.stdout  # the log's tail
    (written,) = (tmp_path / "out").glob("suite_*.json")
    assert written.name == "suite_vocoder_graphs_cpu_hub.json"
    assert results.validate(json.loads(written.read_text()), written.name) == []

    broken.clear()  # a rerun redoes the failed part and skips the done one
    messages: list[str] = []
    runner = suite.Runner(config, echo=messages.append)
    assert runner.run() == 0
    assert "vocoder_graphs: done already, skipped (--force to run it again)" in messages
    assert any(m.startswith("engine: done in") for m in messages)
    assert {p.name for p in (tmp_path / "out").glob("suite_*.json")} == {
        "suite_engine_cpu_hub.json",
        "suite_vocoder_graphs_cpu_hub.json",
    }


def test_help_names_stage_11_and_its_options():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "11  benchmark suite" in done.stdout
    for option in (
        "--suite_parts",
        "--suite_out_dir",
        "--suite_detach",
        "--suite_status",
        "--suite_wait",
        "--suite_force",
        "--suite_sweep",
        "--suite_warmup",
        "--suite_serve_args",
        "--suite_part_timeout",
    ):
        assert f"\n  {option} [" in done.stdout


def test_parts_are_selected_by_name_and_group_in_the_suites_order():
    assert suite.select_parts("all") == suite.ALL_PARTS
    assert suite.select_parts("cosyvoice3:offline,engine") == ("engine", "cosyvoice3:offline")
    assert suite.select_parts("token2wav_graphs") == ("flow_graphs", "dit_flow_graphs", "vocoder_graphs")
    assert suite.select_parts("spark_tts") == (
        "spark_tts:streaming",
        "spark_tts:offline",
        "spark_tts:websocket",
    )
    assert len(suite.select_parts("streaming")) == 4 and len(suite.select_parts("serving")) == 8
    assert suite.select_parts("websocket") == tuple(f"{f}:websocket" for f in suite.FAMILIES)
    assert suite.select_parts("all")[-4:] == suite.select_parts("websocket")
    with pytest.raises(ValueError, match="unknown suite part 'nope'"):
        suite.select_parts("engine,nope")


def test_websocket_parts_run_sentence_mode_and_bistream_where_the_family_has_it():
    assert [label for label, _ in suite_websocket.bench_runs("spark_tts")] == ["sentence_default"]
    runs = dict(suite_websocket.bench_runs("cosyvoice3"))
    assert list(runs) == ["sentence_default", "bistream_instruct", "bistream_default"]
    assert "--bistream" in runs["bistream_default"] and "--instructions" in runs["bistream_instruct"]
    argv = suite_websocket.bench_argv("py", "cosyvoice2_dit", 9000, "1,16", Path("o.json"), ["--bistream"])
    assert argv[argv.index("--url") + 1] == "ws://127.0.0.1:9000/v1/audio/speech/stream"
    assert argv[argv.index("--model") + 1] == "cosyvoice2_dit" and argv[-1] == "--bistream"
    assert suite.shown_command(argv, "py").startswith(
        "python scripts/bench_ws_ttfa.py --model cosyvoice2_dit"
    )
    assert suite_websocket.runs_described("spark_tts") == "sentence mode"
    assert suite_websocket.runs_described("cosyvoice2") == (
        "sentence mode, bistream with instruct2 and bistream with the default voice"
    )


def test_a_websocket_parts_settings_leave_out_what_only_stage_4_reads():
    """A new dataset or warm-up redoes the serving parts, not the websocket parts (the bench sends its own text)."""
    device = suite.Device("cuda", "NVIDIA H100 80GB HBM3", 1)
    config = suite.SuiteConfig(exp_dir=Path("exp"), model_source="synthetic-full")
    other = suite.SuiteConfig(exp_dir=Path("exp"), model_source="synthetic-full", dataset="mine", warmup=5)
    for part, same in (("cosyvoice2:websocket", True), ("cosyvoice2:streaming", False)):
        assert (config.settings(part, device) == other.settings(part, device)) is same
    assert config.settings("cosyvoice2:websocket", device) != suite.SuiteConfig(
        exp_dir=Path("exp"), model_source="synthetic-full", sweep="1,16"
    ).settings("cosyvoice2:websocket", device)


@pytest.mark.slow
@pytest.mark.triton
def test_a_websocket_part_times_the_speech_api_and_stops_it(tmp_path, bench_data):
    """Spark-TTS's websocket part on the CPU: its server, the speech API before it, sentence mode at c=1; the
    JSON holds one row per level under the family's name, and neither the API nor the server outlives it."""
    ports = free_ports(4)
    args = suite_args(tmp_path, bench_data)
    args[args.index("spark_tts:streaming")] = "spark_tts:websocket"
    try:
        done = run_sh(tmp_path, ports[:3], *args, "--api_port", str(ports[3]))
    finally:
        run_sh(tmp_path, ports[:3], "stop", "--model", "spark_tts", timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "suite_spark_tts_websocket_cpu_tiny_synthetic.json").read_text())
    assert results.validate(data, "websocket") == []
    (row,) = data["headline"]
    assert (row["model"], row["mode"], row["concurrency"]) == ("spark_tts", "websocket sentence", 1)
    assert row["first_chunk_p50_ms"] > 0 and "0 failed" in row["note"]
    assert list(data["raw"]) == ["sentence_default"] and "bench_ws_ttfa.py" in " ".join(
        data["meta"]["command"]
    )
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", ports[3]), timeout=2).close()


def test_state_tells_interrupted_and_stale_parts_from_done_ones(tmp_path):
    state = SuiteState(tmp_path)
    assert state.status("engine", {}).state == "pending"
    state.start("engine")
    (state.part_dir("engine") / "running").write_text(json.dumps({"pid": 2**22 + 12345, "started": 0}))
    assert state.status("engine", {}).state == "interrupted"
    state.finish("engine", True, {"settings": {"reps": 10}, "seconds": 1.0})
    assert state.status("engine", {"reps": 10}).state == "done" and state.is_done("engine", {"reps": 10})
    assert state.status("engine", {"reps": 20}).state == "stale" and not state.is_done("engine", {"reps": 20})


def _valid(rows: list[dict]) -> list[dict]:
    assert rows and results.validate({"meta": META, "headline": rows}, "test") == []
    return rows


def test_the_script_parts_outputs_become_headline_rows():
    engine = _valid(suite_rows.engine_rows(ENGINE_RAW))
    assert [r["metric"] for r in engine] == [
        "decode step, batch 1",
        "decode step, batch 4",
        "prefill of a 32-token prompt + first step",
        "speed-up over transformers generate, batch 1, end to end",
    ]
    assert engine[0]["note"] == "bench_llm_reference.py in the same run: 2.000" and "note" not in engine[1]
    windowed = ENGINE_RAW | {"settings": ENGINE_RAW["settings"] | {"output_tokens_from": "151643"}}
    assert suite_rows.engine_rows(windowed)[0]["layout"].endswith(", output window from id 151643")
    flow = {
        "flow_dtype": "torch.float16",
        "capture": {"graphs": 40},
        "eager": {"first_chunk_ms": 280.0, "offline_5s_ms": 300.0},
        "graphed": {"first_chunk_ms": 49.0, "offline_5s_ms": 55.0},
        "streams": [
            {"streams": 4, "path": "eager", "first_round_ms": 900.0, "audio_s_per_s": 10.0},
            {"streams": 4, "path": "graphed", "first_round_ms": 70.0, "audio_s_per_s": 90.0},
        ],
    }
    rows = _valid(suite_rows.flow_graphs_rows(flow))
    assert rows[0]["metric"] == "first streamed chunk (75-token prompt), CUDA graphs"
    assert rows[0]["value"] == 49.0
    assert rows[2]["metric"] == "4 streams in lockstep, first chunk round, CUDA graphs"
    assert rows[2]["concurrency"] == 4
    assert rows[2]["note"] == "90.0 audio-s/s; eager: 900.0 ms, 10.0 audio-s/s"
    dit = {
        "flow_dtype": "torch.float32",
        "capture": {"graphs": 0},
        "cases": {k: {"eager_ms": 9.0, "graphed_ms": 8.0} for k in suite_rows.DIT_CASES},
    }
    rows = _valid(suite_rows.dit_flow_graphs_rows(dit))
    assert [r["metric"] for r in rows][0] == "first streamed chunk, padded calls, no capture"


def test_kernel_counts_become_rows_where_the_bench_recorded_them():
    def count(per_call: float) -> dict:
        return {"unit": "CUDA kernels", "calls": 3, "per_call": per_call, "ms_per_call": 40.0, "top": []}

    flow = {
        "flow_dtype": "torch.float16",
        "capture": {"graphs": 40},
        "eager": {"first_chunk_ms": 280.0, "offline_5s_ms": 300.0, "first_chunk_kernels": count(9000.0)},
        "graphed": {"first_chunk_ms": 49.0, "offline_5s_ms": 55.0, "first_chunk_kernels": count(8990.0)},
    }
    (row,) = [r for r in _valid(suite_rows.flow_graphs_rows(flow)) if r["unit"] == "kernels"]
    assert row["metric"] == "CUDA kernels per first streamed chunk, CUDA graphs" and row["value"] == 8990.0
    assert row["note"] == "40.0 ms of them; eager: 9000.0 in 40.0 ms"
    case = {
        "eager_ms": 9.0,
        "graphed_ms": 8.0,
        "graphed_kernels": count(500.0),
        "eager_kernels": count(600.0),
    }
    dit = {"flow_dtype": "torch.float16", "capture": {"graphs": 30}, "cases": {"first_chunk": case}}
    rows = _valid(suite_rows.dit_flow_graphs_rows(dit))
    assert [(r["unit"], r["value"]) for r in rows] == [("ms", 8.0), ("kernels", 500.0)]
    del flow["graphed"]["first_chunk_kernels"]  # a JSON from before the count: no row, no error
    assert all(r["unit"] != "kernels" for r in suite_rows.flow_graphs_rows(flow))
    assert _valid(suite_rows.vocoder_graphs_rows(VOCODER_RAW))[0]["note"] == "eager: 15.2"


def test_client_summaries_become_serving_rows():
    stats = {"p50": 0.1234, "p99": 0.5}
    summary = {
        "runs": [
            {"mode": "streaming", "concurrency": 1, "requests": 4, "failed": 0, "rtf": 0.123456}
            | {"throughput": 8.1, "first_chunk_latency": stats},
            {"mode": "offline", "concurrency": 16, "requests": 26, "failed": 1, "rtf": 0.05}
            | {"throughput": 20.0, "first_chunk_latency": None},
        ]
    }
    tuned = ["--cuda_mps", "true", "--token2wav_instance_num", "4"]
    assert suite_rows.serving_layout(tuned, "spark_tts") == "one tritonserver, MPS"
    layout = suite_rows.serving_layout(tuned, "cosyvoice2")
    assert layout == "one tritonserver, MPS, 4 token2wav instances"
    first, second = _valid(suite_rows.serving_rows(summary, "cosyvoice2", layout))
    assert (first["first_chunk_p50_ms"], first["first_chunk_p99_ms"], first["rtf"]) == (123.4, 500.0, 0.1235)
    assert second["first_chunk_p50_ms"] is None and second["note"] == "1 of 26 requests failed"


def test_status_of_a_fresh_exp_dir_writes_nothing(tmp_path):
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "scripts/gpu_suite.py", "status", "--exp-dir", str(tmp_path / "exp")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    assert done.returncode == 3 and "0 of 16 parts done, 0 failed" in done.stdout
    assert not (tmp_path / "exp").exists() and time.monotonic() - started < 60


@pytest.mark.parametrize("part", ["flow_graphs", "engine"])
def test_on_a_gpu_the_script_parts_skip_what_they_do_not_measure(tmp_path, monkeypatch, part):
    """16 eager lockstep streams take a minute of the suite's 25: the graphed side keeps every stream count.
    The engine's 800 tokens fit 1024, so it captures 3 key-length buckets per batch size, not 5."""
    seen: list[list[str]] = []

    def record(self, argv, log, deadline, commands):
        seen.append(argv)
        raise suite.PartFailed("recorded")

    monkeypatch.setattr(suite.Runner, "command", record)
    config = suite.SuiteConfig(
        exp_dir=tmp_path / "exp", out_dir=tmp_path / "out", parts=(part,), commit="0123abc"
    )
    runner = suite.Runner(
        config, device=suite.Device("cuda", "NVIDIA H100 80GB HBM3", 1), echo=lambda line: None
    )
    assert runner.run() == 1
    (argv,) = seen
    if part == "engine":
        assert argv[1].endswith("bench_llm.py") and argv[argv.index("--max-seq-len") + 1] == "1024"
        # every row: the reference decoder and transformers compute the whole head too
        assert "--output-tokens-from" not in argv
        return
    assert argv[1].endswith("bench_flow_graphs.py")
    assert argv[argv.index("--eager-max-streams") + 1] == "4" and "--device" not in argv
    assert argv[argv.index("--graph-batch-sizes") + 1] == "1,2,4,8"  # what run.sh serves with
