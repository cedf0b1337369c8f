"""The bench scripts' CPU dry runs, and the other scripts no other test runs: tiny synthetic models, one rep,
batch 1-2, each script a subprocess as in tests/test_scripts_smoke.py (RUN_BY there names each run), its JSON
checked for the keys the GPU runs fill, finite positive timings, and eager against padded outputs where a
script compares them. One OpenMP thread per run: the models are tiny and CI's 2 cores are shared.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from test_scripts_smoke import REPO, number, run_script

from tritontts.spark.layout import missing_files

SCRIPTS = REPO / "scripts"
ONE_THREAD = {"OMP_NUM_THREADS": os.environ.get("TRITONTTS_TEST_THREADS", "1")}


def run_json(script: str, *args: str, scratch: Path, timeout: float = 300) -> dict:
    """Run scripts/`script` with `args` and `--out`/`--output` (the last of args) a fresh JSON file; its content."""
    done = run_script(SCRIPTS / script, *args, scratch=scratch, timeout=timeout, env=ONE_THREAD)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    out = Path(args[-1])
    assert out.is_file(), f"{script} wrote no {out}"
    return json.loads(out.read_text())


def positive(value) -> bool:
    return number(value) and value > 0


def assert_positive(row: dict, *keys: str) -> None:
    for key in keys:
        assert positive(row[key]), (key, row)


BROKEN_SCIPY = """
import importlib.abc, importlib.machinery, runpy, sys


class BrokenScipy(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "scipy":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise AttributeError("module 'numpy' has no attribute 'long'")


sys.meta_path.insert(0, BrokenScipy())
transformers = runpy.run_path(sys.argv[1])["import_transformers"]()
print(type(transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    vocab_size=64))).__name__)
"""


def test_bench_llm_reaches_transformers_where_scipy_does_not_import(tmp_path: Path):
    """A PyTorch image's scipy is built for numpy 2; under the servers' numpy<2 it fails to import, and
    transformers' Qwen2 import path would fail with it (seen on an H100 host in the suite's engine part)."""
    script = tmp_path / "broken_scipy.py"
    script.write_text(BROKEN_SCIPY)
    done = run_script(script, str(REPO / "scripts" / "bench_llm.py"), scratch=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip().endswith("Qwen2ForCausalLM")


def test_bench_llm_and_its_reference_on_cpu(tmp_path: Path):
    """bench_llm.py --device cpu --tiny, with bench_llm_reference.py run by its --reference (torch.compile)."""
    sizes = ("--batch-sizes", "1,2", "--hf-batch-sizes", "1", "--prompt-len", "8", "--gen-len", "6")
    args = (
        "--device",
        "cpu",
        "--tiny",
        *sizes,
        "--max-seq-len",
        "64",
        "--reference",
        "--output-tokens-from",
        "100",
    )
    report = run_json("bench_llm.py", *args, "--output", str(tmp_path / "llm.json"), scratch=tmp_path)

    assert report["dtype"] == "fp32" and report["settings"]["device"] == "cpu"
    assert report["settings"]["output_tokens_from"] == "100"
    assert report["settings"]["graphs_captured"] is False and report["settings"]["decode_graphs"] == 0
    assert report["settings"]["decode_attention_used"] == "torch"
    phases = ("load_models", "engine_build", "decode_attention_check", "ours", "transformers", "reference")
    assert list(report["phase_seconds"]) == list(phases)  # where a run's time goes
    ours = report["ours"]
    assert_positive(ours, "prefill_ms")
    for name in ("graph", "padded_eager", "unpadded_eager"):
        assert positive(ours["first_token"][f"prefill_plus_first_step_ms_{name}"]), name
    for batch in ("batch_1", "batch_2"):
        assert_positive(ours[batch], "decode_ms_per_step_median", "decode_tokens_per_s", "end_to_end_s")
    hf = report["transformers_generate"]["batch_1"]
    assert_positive(hf, "prefill_ms", "end_to_end_s", "end_to_end_tokens_per_s")
    assert number(hf["decode_ms_per_step"])  # two runs' difference: a tiny model's can fall below 0
    reference = report["reference"]
    assert "error" not in reference, reference.get("error")
    assert reference["device"] == "cpu" and reference["settings"]["preset"] == "tiny"
    for batch in ("batch_1", "batch_2"):
        assert_positive(
            reference[batch], "decode_ms_per_step_median", "prefill_plus_first_step_ms", "build_s"
        )
    checks = report["checks"]
    assert_positive(
        checks, "speedup_batch_1", "decode_batch_1_over_reference", "decode_batch_2_over_reference"
    )


def test_bench_flow_graphs_cpu_dry_check(tmp_path: Path):
    """CosyVoice2's flow eager against the graphed decoder's padded calls and the encoder's buckets (replayed
    eagerly on CPU), the first chunk's stages, and one then two streams in lockstep (the eager side only up to
    --eager-max-streams)."""
    args = (
        "--device",
        "cpu",
        "--preset",
        "tiny",
        "--reps",
        "1",
        "--streams",
        "1,2",
        "--eager-max-streams",
        "1",
        "--graph-batch-sizes",
        "2,1",
        "--convs",
        "cudnn",
    )
    result = run_json("bench_flow_graphs.py", *args, "--out", str(tmp_path / "flow.json"), scratch=tmp_path)

    assert result["model"] == "synthetic tiny, seed 0" and result["flow_dtype"] == "torch.float32"
    assert result["qkv"] == "fused" and result["convs"] == "cudnn"
    assert result["capture"]["graphs"] == 0
    assert result["capture"]["batch_sizes"] == [1, 2]
    assert [(r["streams"], r["frames"]) for r in result["decoder"]] == [(1, 186), (1, 400), (8, 186)]
    for row in result["decoder"] + result["encoder"]:
        assert_positive(row, "eager_ms", "graphed_ms")
        assert row["max_abs_diff"] < 1e-3, row  # float32: padding moves the output by rounding only
    assert all(positive(row["mel_abs_max"]) for row in result["decoder"])
    assert len(result["encoder"]) == 2
    for path in ("eager", "graphed"):
        assert_positive(result[path], "first_chunk_ms", "offline_5s_ms")
        stages = result[path]["first_chunk_stages_ms"]
        assert_positive(stages, "flow_decoder", "hift", "total")
        assert stages["total"] >= stages["flow_decoder"] + stages["hift"] - 1e-6, stages
        kernels = result[path]["first_chunk_kernels"]  # on the CPU: aten operators per call
        assert kernels["unit"] == "CPU operators" and kernels["per_call"] > 100 and kernels["top"], kernels
    assert [(r["streams"], r["path"]) for r in result["streams"]] == [
        (1, "eager"),
        (1, "graphed"),
        (2, "graphed"),
    ]
    for row in result["streams"]:
        assert_positive(row, "first_round_ms", "audio_s_per_s", "wall_s")
        assert len(row["round_ms"]) > 1 and all(positive(ms) for ms in row["round_ms"])
    assert result["graph_calls"]["graph"] == 0 and result["graph_calls"]["padded"] > 0
    assert result["encoder_graph_calls"]["graph"] > 0 and result["shape_graph_calls"] == {}
    assert positive(result["first_chunk_speedup"])
    assert not list((tmp_path / "tmp").rglob("flow.pt")), "the synthetic checkpoint was left behind"


def test_bench_vocoder_graphs_cpu_dry_check(tmp_path: Path):
    """Both HiFTs at every mel length; no capture on CPU, so both ways are the same eager, seeded call."""
    args = ("--device", "cpu", "--preset", "tiny", "--reps", "1")
    result = run_json("bench_vocoder_graphs.py", *args, "--out", str(tmp_path / "voc.json"), scratch=tmp_path)

    assert result["preset"] == "tiny" and result["cuda_graphs"] is False
    models = {row["model"] for row in result["rows"]}
    assert models == {"cosyvoice2 HiFT", "cosyvoice3 causal HiFT (finalize false)"}
    assert [row["mel_frames"] for row in result["rows"]] == [42, 100, 186, 400] * 2
    for row in result["rows"]:
        assert_positive(row, "eager_ms", "graphed_ms", "speedup", "audio_abs_max")
        assert row["max_abs_diff"] == 0.0, row


def test_bench_dit_stream_cache_cpu_dry_check(tmp_path: Path):
    """Small shapes on the CPU: both update paths give the same cache, and each traffic variant ran in its
    own process (no allocator figures without CUDA)."""
    args = ("--device", "cpu", "--dtype", "float32", "--rounds", "30", "--sample-every", "10", "--reps", "2")
    result = run_json(
        "bench_dit_stream_cache.py", *args, "--output", str(tmp_path / "c.json"), scratch=tmp_path
    )

    assert result["update"]["same"] is True
    assert_positive(result["update"], "two_copies_ms", "one_copies_ms", "cache_mb")
    assert [(run["allocator"], run["copies"]) for run in result["traffic"]] == [
        ("default", "two"),
        ("default", "one"),
    ]
    for run in result["traffic"]:
        assert_positive(run, "ms_per_round")
        assert run["samples"] == [] and run["summary"] == {}


@pytest.fixture(scope="module")
def spark_download(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """download_model.py's tiny synthetic Spark-TTS checkpoint (run.sh stage 0), for the codec bench too."""
    scratch = tmp_path_factory.mktemp("download_model")
    out = scratch / "spark"
    args = ("--model", "spark_tts", "--model_source", "synthetic-tiny", "--output_dir", str(out))
    done = run_script(SCRIPTS / "download_model.py", *args, scratch=scratch, timeout=300, env=ONE_THREAD)
    return done, out


def test_download_model_writes_a_complete_checkpoint_and_names_what_a_local_one_lacks(
    spark_download, tmp_path
):
    done, out = spark_download
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"spark_tts checkpoint ready at {out}" in done.stdout
    assert missing_files(out) == []
    assert json.loads((out / "SYNTHETIC.json").read_text())["preset"] == "tiny"
    again = run_script(SCRIPTS / "download_model.py", *done.args[2:], scratch=tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "nothing to write" in again.stdout  # stage 0 again with the same source, preset and seed

    local = tmp_path / "local"
    local.mkdir()
    for entry in out.iterdir():
        if entry.name != "config.yaml":
            (local / entry.name).symlink_to(entry)
    args = ("--model", "spark_tts", "--model_source", str(local))
    broken = run_script(SCRIPTS / "download_model.py", *args, scratch=tmp_path, timeout=60)
    assert broken.returncode == 1
    assert (
        broken.stderr.strip()
        == f"error: {local} is not a complete spark_tts checkpoint; missing: config.yaml"
    )


def test_bench_spark_codec_cpu_dry_check(spark_download, tmp_path: Path):
    """BiCodec's detokenize five ways (padded passes eager on CPU; TF32 and bf16 beside fp32) and tokenize in fp32,
    bf16 and per bucket."""
    done, model_dir = spark_download
    assert done.returncode == 0, done.stderr[-4000:]
    args = ("--device", "cpu", "--model-dir", str(model_dir), "--reps", "1", "--batch", "2")
    result = run_json("bench_spark_codec.py", *args, "--out", str(tmp_path / "codec.json"), scratch=tmp_path)

    detokenize = [row for row in result["rows"] if row["call"] == "detokenize"]
    cases = ["len50", "len150", "len216", "len320", "batch2", "fresh1", "fresh2"]
    assert [row["case"] for row in detokenize] == cases * 5
    for row in detokenize:
        assert positive(row["ms"]), row
        if "max_abs_diff" in row and not row["variant"].endswith("bf16"):  # against the earlier way's audio
            assert row["max_abs_diff"] < 1e-4 and row["snr_db"] > 60, row
        elif "max_abs_diff" in row:
            assert number(row["snr_db"]) and row["snr_db"] > 0, row
    tokenize = [row for row in result["rows"] if row["call"] == "tokenize"]
    assert [row.get("dtype", row.get("reference_bucket")) for row in tokenize] == ["fp32", "bf16", 0, 16000]
    assert all(positive(row["ms"]) for row in tokenize)
    assert tokenize[0]["global_tokens_equal"] == tokenize[0]["semantic_tokens_equal"] == 1.0
    assert tokenize[2]["lengths_warmed_at_load"] == 0 and tokenize[3]["lengths_warmed_at_load"] > 0
    assert 0 <= tokenize[3]["semantic_tokens_equal_unpadded"] <= 1


def test_bench_gpu_sharing_cpu_dry_check(tmp_path: Path):
    """The first chunk alone, beside the LLM decoding in a child process (its steps per second both ways), and
    beside it with the first-chunk board shared (the LLM holds its steps while a chunk is made), on cuDNN's
    convolutions (the A/B's other side)."""
    arms = "alone,llm,llm_first_chunk_priority"
    args = ("--device", "cpu", "--preset", "tiny", "--reps", "3", "--arms", arms, "--convs", "cudnn")
    result = run_json("bench_gpu_sharing.py", *args, "--out", str(tmp_path / "share.json"), scratch=tmp_path)

    assert (
        result["preset"] == "tiny"
        and result["convs"] == "cudnn"
        and set(result["arms"]) == set(arms.split(","))
    )
    assert result["estimator_compiled"] is False and result["kernels_per_chunk"]["per_call"] > 0, result
    for arm in result["arms"].values():
        assert_positive(arm, "first_chunk_ms_min", "first_chunk_ms_median", "first_chunk_ms_p90")
        assert arm["first_chunk_ms_min"] <= arm["first_chunk_ms_median"] <= arm["first_chunk_ms_p90"], arm
    assert (
        result["arms"]["alone"]["llm_environment"] is None and result["arms"]["llm"]["llm_environment"] == {}
    )
    llm, held = result["arms"]["llm"], result["arms"]["llm_first_chunk_priority"]
    for arm in (llm, held):
        assert positive(arm["decode_steps_per_s_alone"]), arm  # over 2 s alone
        assert number(arm["decode_steps_per_s_shared"]) and arm["decode_steps_per_s_shared"] >= 0, arm
    assert llm["llm_held_s_shared"] == 0 and held["llm_held_s_shared"] > 0, result["arms"]
    assert held["llm_environment"] == {"TRITONTTS_BENCH_FIRST_CHUNK_BOARD": "<a temporary file>"}


def test_bench_decode_pdl_chain_in_the_triton_interpreter(tmp_path: Path):
    """The stand-in decode chain's GEMV kernel (plain launches: PDL's instructions do not run in Triton's CPU
    interpreter) against torch's product of the same inputs, kernel by kernel, on the tiny shape."""
    out = tmp_path / "pdl.json"
    done = run_script(
        SCRIPTS / "bench_decode_pdl.py",
        *("--device", "cpu", "--preset", "tiny", "--out", str(out)),
        scratch=tmp_path,
        timeout=300,
        env={**ONE_THREAD, "TRITON_INTERPRET": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["shape"] == {"hidden": 64, "qkv": 96, "intermediate": 160, "layers": 2, "down_shares": 2}
    assert 0 <= result["plain_chain_vs_torch_max_rel_error"] < 1e-5, result
    assert result["timing"] is None and result["triton"]


STAND_IN_SCENARIOS = """
import json
import os

import pytest

pytestmark = pytest.mark.reliability


def record(scenario):
    knobs = {k: v for k, v in os.environ.items() if k.startswith("TRITONTTS_SOAK_") and k != "TRITONTTS_SOAK_REPORT"}
    with open(os.environ["TRITONTTS_SOAK_REPORT"], "a") as out:
        out.write(json.dumps({"scenario": scenario, "knobs": knobs}) + "\\n")


def test_passes():
    record("passes")


def test_fails():
    record("fails")
    assert False, "a failed scenario"


def test_not_selected():
    record("not selected")
"""


def knobs_the_reliability_tests_read() -> set[str]:
    names = set()
    for path in (REPO / "tests").glob("test_reliability_*.py"):
        names |= set(re.findall(r'\bknob\("(\w+)"', path.read_text(encoding="utf-8")))
    return {f"TRITONTTS_SOAK_{name.upper()}" for name in names}


def test_soak_collects_the_scenarios_and_scales_every_knob(tmp_path: Path):
    """soak.py over stand-in scenarios (the reliability tests themselves run in CI): what each records lands in
    the report, a failed one too, with every knob the reliability tests read set from the options."""
    stand_in = tmp_path / "scenarios" / "test_stand_in_scenarios.py"
    stand_in.parent.mkdir()
    stand_in.write_text(STAND_IN_SCENARIOS)
    out = tmp_path / "soak.json"
    args = ("--tests", str(stand_in), "-k", "passes or fails", "--seconds", "2", "--vanishing", "3")
    done = run_script(SCRIPTS / "soak.py", *args, "--output", str(out), scratch=tmp_path, timeout=120)

    assert done.returncode == 1, done.stderr[-4000:]  # pytest's: a scenario failed
    report = json.loads(out.read_text())
    assert report["pytest"]["returncode"] == 1 and "1 failed, 1 passed" in report["pytest"]["summary"]
    assert [line.split()[1].split("::")[-1] for line in report["pytest"]["failed"]] == ["test_fails"]
    assert [s["scenario"] for s in report["scenarios"]] == ["passes", "fails"]
    knobs = report["scenarios"][0]["knobs"]
    assert set(knobs) >= knobs_the_reliability_tests_read(), "soak.py sets no option for a knob"
    assert knobs["TRITONTTS_SOAK_SECONDS"] == "2.0" and knobs["TRITONTTS_SOAK_VANISHING"] == "3"
    assert report["settings"]["seconds"] == 2.0 and report["settings"]["k"] == "passes or fails"
    assert report["machine"]["cores"] == os.cpu_count() and positive(report["wall_s"])
    assert f"report: {out}" in done.stdout
