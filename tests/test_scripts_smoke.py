"""The scripts under scripts/ and the `python -m tritontts...` entry points run: each one's --help, and the CPU
dry checks of bench_dit_flow_graphs.py and bench_cosyvoice3_flow_graphs.py end to end. Every script is run for
real somewhere in tests/ (RUN_BY: the test that runs it) or says why not (NEEDS_GPU, NOT_RUN), so a new script
cannot come without a run.

Each runs as a subprocess of this interpreter (the test virtual environment's python) from a scratch folder,
with this checkout first on PYTHONPATH, as a user would run it from the repository.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((REPO / "scripts").glob("*.py"))
DIT_BENCH = REPO / "scripts" / "bench_dit_flow_graphs.py"
COSYVOICE3_BENCH = REPO / "scripts" / "bench_cosyvoice3_flow_graphs.py"


def entry_points() -> list[str]:
    """Every module of the package that runs as `python -m`: a `__main__.py`, or a `__main__` guard."""
    modules = []
    for path in sorted((REPO / "tritontts").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        if path.name == "__main__.py":
            modules.append(".".join(parts[:-1]))
        elif 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
            modules.append(".".join(parts))
    return modules


ENTRY_POINTS = entry_points()

# script: the test that runs it for real ("tests/FILE.py::NAME", NAME a test or the fixture that runs it)
RUN_BY = {
    "bench_cosyvoice3_flow_graphs.py": "tests/test_scripts_smoke.py::test_bench_cosyvoice3_flow_graphs_cpu_dry_check",
    "bench_decode_pdl.py": "tests/test_bench_scripts_cpu.py::test_bench_decode_pdl_chain_in_the_triton_interpreter",
    "bench_dit_flow_graphs.py": "tests/test_scripts_smoke.py::test_bench_dit_flow_graphs_cpu_dry_check",
    "bench_flow_graphs.py": "tests/test_bench_scripts_cpu.py::test_bench_flow_graphs_cpu_dry_check",
    "bench_gpu_sharing.py": "tests/test_bench_scripts_cpu.py::test_bench_gpu_sharing_cpu_dry_check",
    "bench_llm.py": "tests/test_bench_scripts_cpu.py::test_bench_llm_and_its_reference_on_cpu",
    "bench_llm_reference.py": "tests/test_bench_scripts_cpu.py::test_bench_llm_and_its_reference_on_cpu",
    "bench_spark_codec.py": "tests/test_bench_scripts_cpu.py::test_bench_spark_codec_cpu_dry_check",
    "bench_token2wav.py": "tests/test_bench_token2wav.py::both_modes",
    "bench_dit_stream_cache.py": "tests/test_bench_scripts_cpu.py::test_bench_dit_stream_cache_cpu_dry_check",
    "bench_vocoder_graphs.py": "tests/test_bench_scripts_cpu.py::test_bench_vocoder_graphs_cpu_dry_check",
    "bench_voice_profile.py": "tests/test_voice_modes_triton.py::test_the_profile_benchmark_runs",
    "bench_ws_ttfa.py": "tests/test_speech_ws.py::test_the_time_to_first_audio_benchmark_writes_schema_rows",
    "benchmark_results.py": "tests/test_benchmark_results.py::test_check_passes_on_the_repository",
    "convert_checkpoint.py": "tests/test_convert_checkpoint.py::test_sharded_hf_checkpoint_and_cli",
    # run.sh --gpus starts and stops the servers through it
    "disaggregated.py": "tests/test_data_parallel.py::test_run_sh_gpus_serves_one_pipeline_per_gpu_and_spreads_the_requests",
    "download_model.py": "tests/test_bench_scripts_cpu.py::spark_download",
    "gpu_suite.py": "tests/test_gpu_suite.py::first_run",
    "fill_template.py": "tests/test_fill_template.py::test_output_file_leaves_template_alone",
    "make_benchmark_data.py": "tests/conftest.py::bench_data",
    "make_synthetic_checkpoint.py": "tests/test_synthetic_llm.py::test_full_checkpoint_layout_and_script",
    "make_wheelhouse.py": "tests/test_wheelhouse.py::test_stage_minus_one_installs_from_the_wheelhouse_with_no_index",
    "soak.py": "tests/test_bench_scripts_cpu.py::test_soak_collects_the_scenarios_and_scales_every_knob",
    "soak_traffic.py": "tests/test_soak_traffic.py::test_soak_traffic_on_the_tiny_spark_api",
    "trace_summary.py": "tests/test_triton_trace.py::test_trace_summary_prints_the_slowest_first_and_names_a_missing_file",
    "triton_server.py": "tests/test_triton_infra.py::test_cli_start_status_stop",
}
KERNEL_BENCH = "Triton kernels in CUDA graphs timed by CUDA events; {} runs them in Triton's CPU interpreter"
FLOW_PREFIX_BENCH = (
    "the full-size flow decoder timed on a GPU, CUDA-graphed; {} checks the same paths on the CPU"
)
NEEDS_GPU = {
    "bench_flow_prefix.py": FLOW_PREFIX_BENCH.format("tests/test_cosyvoice2_flow_prefix.py"),
    "bench_flow_prefix_graphs.py": FLOW_PREFIX_BENCH.format("tests/test_cosyvoice2_flow_prefix.py"),
    "bench_norm_linear.py": KERNEL_BENCH.format("tests/test_norm_linear.py"),
    "bench_skinny_linear.py": KERNEL_BENCH.format("tests/test_skinny_linear.py"),
    "bench_topk.py": KERNEL_BENCH.format("tests/test_top_k.py"),
    "bench_vocoder_compile.py": "BiCodec's passes in CUDA graphs, eager against compiled, timed on a GPU; "
    "tests/test_padded_detokenize.py checks the compiled passes against each item alone on the CPU",
}
NOT_RUN = {
    "build_python_stub.py": "builds Triton's python-backend stub from source (git, CMake, minutes of C++); "
    "tests/test_stub_build.py runs its plan, checks and steps with the commands stubbed",
}


def run_script(
    script: Path | str, *args: str, scratch: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`script args` (a file, or `-m module`) from `scratch/cwd`, its temporary files under `scratch/tmp`, with
    `env` added to this process's environment."""
    cwd, tmp = scratch / "cwd", scratch / "tmp"
    cwd.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    env = dict(os.environ, **(env or {}), TMPDIR=str(tmp))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, *(["-m", script] if isinstance(script, str) else [str(script)]), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_script_is_listed():
    assert DIT_BENCH in SCRIPTS and len(SCRIPTS) > 10


def test_every_script_is_run_or_says_why_not():
    listed, names = [*RUN_BY, *NEEDS_GPU, *NOT_RUN], {s.name for s in SCRIPTS}
    assert len(listed) == len(set(listed)), "a script is listed twice"
    assert not set(listed) - names, f"listed but gone: {sorted(set(listed) - names)}"
    unlisted = sorted(names - set(listed))
    assert not unlisted, (
        f"{unlisted}: add each to RUN_BY with the test that runs it (or to NEEDS_GPU saying why)"
    )


@pytest.mark.parametrize("script, where", sorted(RUN_BY.items()))
def test_the_run_named_for_a_script_exists_and_names_it(script: str, where: str):
    path, name = where.split("::")
    text = (REPO / path).read_text(encoding="utf-8")
    assert re.search(rf"^def {name}\(", text, re.MULTILINE), f"{where} is gone"
    assert script in text, f"{path} does not name {script}"


PROGRAMS = [*SCRIPTS, *ENTRY_POINTS]
PROGRAM_IDS = [s.name for s in SCRIPTS] + ENTRY_POINTS


@pytest.fixture(scope="module")
def help_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every program's `--help`, 4 at a time (each is mostly the interpreter's imports), in a scratch of its own."""

    scratches = [
        tmp_path_factory.mktemp(f"help{index}") for index in range(len(PROGRAMS))
    ]  # not from threads

    def run(index: int) -> tuple[subprocess.CompletedProcess, Path]:
        return run_script(PROGRAMS[index], "--help", scratch=scratches[index], timeout=120), scratches[index]

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(PROGRAM_IDS, pool.map(run, range(len(PROGRAMS)))))


@pytest.mark.parametrize("name", PROGRAM_IDS)
def test_help(name: str, help_runs):
    done, scratch = help_runs[name]
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.lstrip().startswith("usage:"), done.stdout[:2000]
    assert list((scratch / "cwd").iterdir()) == [], "--help wrote files"


def test_the_entry_points_are_found():
    assert {"tritontts.openai_api", "tritontts.llm.openai_server", "tritontts.triton.watchdog"} <= set(
        ENTRY_POINTS
    )


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_graph_bench_dry_check(
    script: Path, tmp_path: Path, *extra: str, more_cases: tuple[str, ...] = ()
) -> dict:
    """A token2wav graph bench on the CPU (tiny synthetic checkpoint, one rep): its JSON, with the fields and the
    cases both benches share checked. Each case's graphed path ran its padded calls eagerly (no capture on CPU),
    float32, so it gives the eager mel up to rounding; the kernel counts are aten operators there."""
    out = tmp_path / "out" / f"{script.stem}.json"
    out.parent.mkdir()
    args = ("--device", "cpu", "--preset", "tiny", "--reps", "1", "--out", str(out), *extra)
    done = run_script(script, *args, scratch=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"wrote {out}" in done.stdout
    result = json.loads(out.read_text())

    assert {
        "device",
        "torch",
        "python",
        "command",
        "model",
        "flow_dtype",
        "reps",
        "graph_config",
        "capture",
        "cases",
    } <= set(result)
    assert result["model"] == "synthetic tiny, seed 0"
    assert result["flow_dtype"] == "torch.float32"
    assert result["reps"] == 1
    assert result["capture"]["graphs"] == 0 and result["capture"]["note"]
    shared = ("first_chunk", "later_chunk", "offline_5s")
    assert set(result["cases"]) == {*shared, *more_cases}
    for name, case in ((name, result["cases"][name]) for name in shared):
        for key in ("eager_ms", "graphed_ms", "speedup", "mel_max_abs_diff", "mel_abs_max"):
            assert number(case[key]), (name, key, case[key])
        assert case["eager_ms"] > 0 and case["graphed_ms"] > 0 and case["speedup"] >= 0, (name, case)
        assert case["mel_frames"] > 0 and case["mel_abs_max"] > 0, (name, case)
        assert case["mel_max_abs_diff"] < 1e-3, (name, case)
        assert case["decoder_calls"]["graph"] == 0 and case["decoder_calls"]["padded"] > 0, (name, case)
        for path in ("eager", "graphed"):
            kernels = case[f"{path}_kernels"]
            assert kernels["unit"] == "CPU operators" and kernels["per_call"] > 10, (name, path, kernels)
    return result


def test_bench_dit_flow_graphs_cpu_dry_check(tmp_path: Path):
    """Eager against the graphed decoder's padded calls (no capture on CPU), a synthetic tiny checkpoint, on the
    unfused q/k/v projections (the path before tritontts.qkv) and cuDNN's convolutions (before tritontts.conv_gemm),
    the other sides of the A/Bs of a GPU session."""
    extra = ("--qkv", "unfused", "--convs", "cudnn", "--batch-sizes", "1,2,4", "--streams", "3")
    result = run_graph_bench_dry_check(DIT_BENCH, tmp_path, *extra, more_cases=("batched_first_chunks",))
    assert result["qkv"] == "unfused" and result["convs"] == "cudnn"
    assert result["graph_config"]["batch_sizes"] == [1, 2, 4]
    batched = result["cases"]["batched_first_chunks"]["3"]  # three streams' first chunks in one padded call
    assert batched["decoder_calls_together"] == {"graph": 0, "padded": 1, "eager": 0}, batched
    assert (
        batched["together_ms"] > 0 and batched["one_by_one_ms"] > 0 and batched["audio_max_abs_diff"] < 1e-3
    )
    for name in ("first_chunk", "later_chunk"):
        case = result["cases"][name]
        assert case["cache_att_max_abs_diff"] < 1e-3 and case["cache_cnn_max_abs_diff"] < 1e-3, (name, case)
    assert (
        result["cases"]["later_chunk"]["cache_frames_before"]
        > result["cases"]["first_chunk"]["cache_frames_before"]
    )
    # the synthetic checkpoint's temporary folder is removed once loaded
    assert not list((tmp_path / "tmp").rglob("*.pt")) and not list((tmp_path / "tmp").rglob("flow.yaml"))


def test_bench_cosyvoice3_flow_graphs_cpu_dry_check(tmp_path: Path):
    """CosyVoice3's Token2Mel eager against the graphed decoder's padded calls and the encoder's buckets replayed
    eagerly (no capture on CPU), a synthetic tiny checkpoint."""
    result = run_graph_bench_dry_check(COSYVOICE3_BENCH, tmp_path)
    assert result["graph_config"]["batch_sizes"] == [1] and result["graph_config"]["compile"] is False
    for name, case in result["cases"].items():
        assert case["encoder_calls"]["graph"] > 0, (name, case)  # the encoder's buckets replayed eagerly
    # 2 mel frames per token: 15 tokens (3 more look-ahead), 25 after token_offset 100 (3 look-ahead), 125 final
    assert [result["cases"][name]["mel_frames"] for name in ("first_chunk", "later_chunk", "offline_5s")] == [
        30,
        50,
        250,
    ]
    # the synthetic checkpoint's temporary folder is removed once loaded
    assert not list((tmp_path / "tmp").rglob("*.pt")) and not list(
        (tmp_path / "tmp").rglob("cosyvoice3.yaml")
    )
