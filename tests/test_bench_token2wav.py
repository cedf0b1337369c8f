"""scripts/bench_token2wav.py on tiny synthetic checkpoints (CosyVoice2 flow + HiFT, Step-Audio-2-mini DiT):
audio lengths, the streamed calls, warm-up, speakers per distinct prompt, dataset vs synthetic tokens."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tritontts.bench.dataset import Utterance, load_utterances, write_parquet
from tritontts.bench.durations import expected_tokens
from tritontts.bench.token2wav_bench import synthetic_tokens, targets_of
from tritontts.bench.token2wav_models import model_folder
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.synthetic.cosyvoice2 import voiced_signal, write_cosyvoice2_checkpoint
from tritontts.synthetic.dit_token2wav import write_dit_token2wav

pytest.importorskip("pyarrow.parquet")
REPO = Path(__file__).resolve().parents[1]
SPLIT = "wenetspeech4tts"
SAMPLES_PER_TOKEN = 960
TARGET_LENGTHS = (24, 40, 70)
STRATEGY = {"cosyvoice2": "fixed", "cosyvoice2_dit": "exponential"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _script():
    spec = importlib.util.spec_from_file_location("bench_token2wav", REPO / "scripts" / "bench_token2wav.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The folder run.sh stage 0 writes for cosyvoice2_dit: CosyVoice2-0.5B/, cosyvoice2_llm/, Step-Audio-2-mini/."""
    root = tmp_path_factory.mktemp("t2w_ckpt")
    write_cosyvoice2_checkpoint(root, preset="tiny", seed=0)
    write_dit_token2wav(root / "Step-Audio-2-mini" / "token2wav", preset="tiny", seed=0)
    return root


@pytest.fixture(scope="module")
def cosy2_rows(bench_data: Path) -> list[Utterance]:
    """Three bench_data rows with short target tokens and short prompts; rows 0 and 2 share theirs."""
    rows = load_utterances(bench_data, SPLIT)[:3]
    prompts = [voiced_signal(seconds=2.0, seed=1), voiced_signal(seconds=1.5, seed=2)]
    rng = np.random.default_rng(7)
    out = []
    for i, (row, count) in enumerate(zip(rows, TARGET_LENGTHS, strict=True)):
        out.append(
            replace(
                row,
                prompt_audio=prompts[i % 2],
                sample_rate=16000,
                prompt_tokens=rng.integers(0, 6561, 50).astype(np.int32),
                target_tokens=rng.integers(0, 6561, count).astype(np.int32),
            )
        )
    return out


@pytest.fixture(scope="module")
def cosy2_data(cosy2_rows: list[Utterance], tmp_path_factory) -> Path:
    return write_parquet(cosy2_rows, tmp_path_factory.mktemp("cosy2") / f"{SPLIT}.parquet")


def _run(checkpoint: Path, data: Path, log_dir: Path, model: str, *extra: str) -> int:
    argv = [
        "--model",
        model,
        "--model-dir",
        str(checkpoint),
        "--huggingface-dataset",
        str(data),
        "--split-name",
        SPLIT,
        "--device",
        "cpu",
        "--log-dir",
        str(log_dir),
        *extra,
    ]
    return _script().main(argv)


def _report(log_dir: Path, model: str, mode: str) -> dict:
    return json.loads((log_dir / f"token2wav_{model}_{mode}.json").read_text())


@pytest.fixture(scope="module", params=["cosyvoice2", "cosyvoice2_dit"])
def both_modes(request, checkpoint: Path, cosy2_data: Path, tmp_path_factory) -> tuple[str, Path]:
    """One run per model: both modes, one warm-up row, WAVs saved."""
    model = request.param
    log_dir = tmp_path_factory.mktemp(f"log_{model}")
    extra = ("--mode", "both", "--strategy", STRATEGY[model], "--warmup", "1", "--save-wavs")
    assert _run(checkpoint, cosy2_data, log_dir, model, *extra) == 0
    return model, log_dir


@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_audio_is_960_samples_per_dataset_token(both_modes, cosy2_rows, mode: str) -> None:
    model, log_dir = both_modes
    report = _report(log_dir, model, mode)
    assert report["tokens"] == "dataset"
    records = report["records"]
    assert [r["id"] for r in records] == [u.id for u in cosy2_rows]
    assert [r["tokens"] for r in records] == list(TARGET_LENGTHS)
    assert all(r["tokens_source"] == "dataset" for r in records)
    for r in records:
        assert r["samples"] == r["tokens"] * SAMPLES_PER_TOKEN
        assert r["audio_s"] == pytest.approx(r["samples"] / 24000)
        wav, rate = soundfile.read(r["wav"], dtype="float32")
        assert rate == 24000 and wav.shape == (r["samples"],) and np.abs(wav).max() > 0


def test_streaming_records_follow_the_schedule(both_modes) -> None:
    model, log_dir = both_modes
    report = _report(log_dir, model, "streaming")
    schedule = StreamSchedule(15, 3, exponential=STRATEGY[model] == "exponential")
    assert report["settings"]["schedule"]["exponential"] == schedule.exponential
    for r in report["records"]:
        assert r["chunks"] == len(r["chunk_latencies"]) == len(schedule.plan(r["tokens"]))
        assert sum(r["chunk_samples"]) == r["samples"]
        assert r["first_chunk_latency"] == r["chunk_latencies"][0]
        assert r["latency"] >= sum(r["chunk_latencies"])
    assert report["summary"]["chunks"] == sum(len(schedule.plan(n)) for n in TARGET_LENGTHS)
    assert report["summary"]["first_chunk_latency"]["count"] == len(TARGET_LENGTHS)


@pytest.mark.parametrize("mode", ["offline", "streaming"])
def test_warmup_rows_run_apart_and_are_not_counted(both_modes, cosy2_rows, mode: str) -> None:
    model, log_dir = both_modes
    report = _report(log_dir, model, mode)
    assert report["warmup"]["ids"] == [cosy2_rows[0].id] and report["warmup"]["seconds"] > 0
    summary = report["summary"]
    assert summary["rows"] == summary["latency"]["count"] == len(cosy2_rows)
    assert summary["compute_s"] == pytest.approx(sum(r["latency"] for r in report["records"]))
    assert summary["rtf"] == pytest.approx(summary["compute_s"] / summary["audio_s"])


def test_speakers_are_prepared_once_per_distinct_prompt(both_modes) -> None:
    model, log_dir = both_modes
    for mode in ("offline", "streaming"):
        report = _report(log_dir, model, mode)
        prepared = [r["speaker_s"] is not None for r in report["records"]]
        assert prepared == [True, True, False]
        assert report["summary"]["speakers"]["prepared"] == 2


def test_report_fields_and_table(both_modes) -> None:
    model, log_dir = both_modes
    report = _report(log_dir, model, "streaming")
    for key in ("model", "mode", "device", "device_name", "dtype", "tokens", "settings", "warmup", "summary"):
        assert key in report, key
    assert report["model"] == model and report["device"] == "cpu" and report["dtype"] == "float32"
    assert report["cuda_graphs"] is False  # auto: graphs on CUDA only
    assert report["settings"]["token_hop_len"] == 15 and report["settings"]["pre_lookahead_len"] == 3
    for key in ("avg", "p50", "p90", "p99"):
        assert report["summary"]["latency"][key] > 0
    assert report["summary"]["first_chunk_latency"]["p50"] > 0
    assert _report(log_dir, model, "offline")["summary"]["first_chunk_latency"] is None
    table = (log_dir / f"token2wav_{model}_streaming.md").read_text()
    assert "tokens: dataset" in table and "| Streaming | 1 | 3 | 0 |" in table


def test_rows_without_tokens_get_synthetic_ones(checkpoint: Path, bench_data: Path, tmp_path, capsys) -> None:
    extra = ("--mode", "offline", "--warmup", "0", "--max-rows", "2")
    assert _run(checkpoint, bench_data, tmp_path, "cosyvoice2_dit", *extra) == 0
    report = _report(tmp_path, "cosyvoice2_dit", "offline")
    rows = load_utterances(bench_data, SPLIT)[:2]
    assert report["tokens"] == "synthetic" and report["warmup"]["rows"] == 0
    assert [r["tokens"] for r in report["records"]] == [expected_tokens(u.target_text, 25) for u in rows]
    assert all(r["samples"] == r["tokens"] * SAMPLES_PER_TOKEN for r in report["records"])
    assert not (tmp_path / "token2wav_cosyvoice2_dit_streaming.json").exists()
    assert "| Offline | 1 | 2 | 0 |" in capsys.readouterr().out


def test_synthetic_tokens_are_seeded_speech_ids() -> None:
    text = "Speech synthesis turns written words into natural sounding audio."
    tokens = synthetic_tokens(text, 6561, seed=0, index=3)
    assert len(tokens) == expected_tokens(text, 25) and 0 <= tokens.min() and tokens.max() < 6561
    np.testing.assert_array_equal(tokens, synthetic_tokens(text, 6561, seed=0, index=3))
    assert not np.array_equal(tokens, synthetic_tokens(text, 6561, seed=0, index=4))


def test_bad_dataset_tokens_are_refused(cosy2_rows) -> None:
    bad = replace(cosy2_rows[0], target_tokens=np.array([1, 6561], dtype=np.int32))
    with pytest.raises(ValueError, match=f"row {bad.id}: target_audio_cosy2_tokens holds ids outside"):
        targets_of([bad], 6561, seed=0)
    empty = replace(cosy2_rows[0], target_tokens=np.zeros(0, dtype=np.int32))
    with pytest.raises(ValueError, match="is empty"):
        targets_of([empty], 6561, seed=0)


def test_model_dir_is_the_stage0_folder_or_the_model_folder(checkpoint: Path) -> None:
    dit = checkpoint / "Step-Audio-2-mini" / "token2wav"
    assert model_folder(checkpoint, "cosyvoice2_dit") == dit
    assert model_folder(dit, "cosyvoice2_dit") == dit
    assert model_folder(checkpoint, "cosyvoice2") == checkpoint / "CosyVoice2-0.5B"
    with pytest.raises(FileNotFoundError, match="Step-Audio-2-mini/token2wav"):
        model_folder(checkpoint / "CosyVoice2-0.5B", "cosyvoice2_dit")


def test_errors_name_the_option(checkpoint: Path, cosy2_data: Path, tmp_path, capsys) -> None:
    assert _run(checkpoint, cosy2_data, tmp_path, "cosyvoice2_dit", "--pre-lookahead-len", "4") == 1
    assert "--pre-lookahead-len 3" in capsys.readouterr().err
    assert _run(tmp_path, cosy2_data, tmp_path, "cosyvoice2", "--mode", "offline") == 1
    assert "--model-dir" in capsys.readouterr().err
    assert (
        _run(checkpoint, cosy2_data, tmp_path, "cosyvoice2", "--device", "cpu", "--cuda-graphs", "true") == 1
    )
    assert "cuda_graphs true needs a CUDA device" in capsys.readouterr().err
