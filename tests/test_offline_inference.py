"""offline_inference.py on the tiny synthetic checkpoints (Spark-TTS, CosyVoice2): WAVs, report arithmetic, forced
lengths, backends."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tritontts.bench.dataset import Utterance, write_manifest
from tritontts.bench.durations import (
    count_cjk_syllables,
    count_words,
    expected_seconds,
    expected_tokens,
)
from tritontts.bench.offline_llm import trtllm_available

REPO = Path(__file__).resolve().parents[1]
HOP = 320
TARGETS = ("你好。", "Hello there.", "今天天气很好，我们去散步吧。")  # u2 outlasts its untranscribed clip


def _voice(rate: int, seconds: float, pitch: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    noise = np.random.default_rng(int(pitch)).normal(0, 0.02, t.size)
    return (0.3 * np.sin(2 * np.pi * pitch * t) + noise).astype(np.float32)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("offline_data")
    rows = [
        # transcripts about as long as their clips: the synthetic LLMs speak the text's share of the context
        Utterance("u0", "这是一段参考文本。", _voice(16000, 1.5, 180.0), 16000, TARGETS[0]),
        Utterance("u1", "A reference.", _voice(22050, 1.2, 220.0), 22050, TARGETS[1]),
        Utterance("u2", "", _voice(16000, 1.0, 140.0), 16000, TARGETS[2]),
    ]
    return write_manifest(rows, folder)


def _load_script():
    spec = importlib.util.spec_from_file_location("offline_inference", REPO / "offline_inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(spark_tiny_dir: Path, dataset: Path, log_dir: Path, *extra: str) -> int:
    return _load_script().main(
        [
            "--model-dir",
            str(spark_tiny_dir),
            "--huggingface-dataset",
            str(dataset),
            "--device",
            "cpu",
            "--log-dir",
            str(log_dir),
            "--limit-rows",
            "3",
            *extra,
        ]
    )


def _report(log_dir: Path, backend: str) -> dict:
    return json.loads((log_dir / f"offline_{backend}.json").read_text())


def _assert_wavs_match_tokens(log_dir: Path, backend: str, result: dict) -> None:
    assert len(result["records"]) == result["rows"]
    for record in result["records"]:
        wav, rate = soundfile.read(log_dir / f"{backend}_bs{result['batch_size']}" / f"{record['id']}.wav")
        assert rate == 16000
        assert record["semantic_tokens"] > 0
        assert len(wav) == HOP * record["semantic_tokens"]
        assert record["audio_s"] == pytest.approx(len(wav) / 16000)


@pytest.fixture(scope="module")
def torch_run(spark_tiny_dir, dataset, tmp_path_factory) -> tuple[Path, dict]:
    log_dir = tmp_path_factory.mktemp("offline_torch")
    assert _run(spark_tiny_dir, dataset, log_dir, "--batch-sizes", "1,2", "--max-new-tokens", "6") == 0
    return log_dir, _report(log_dir, "torch")


def test_durations_count_syllables_and_words():
    assert count_cjk_syllables("你好，世界。") == 4
    assert count_words("你好，世界。") == 0
    assert count_words("The meeting's at 3 o'clock.") == 5
    assert count_cjk_syllables("AI正在改变") == 4 and count_words("AI正在改变") == 1
    assert expected_seconds("") == 0
    assert expected_seconds("你好世界") == pytest.approx(4 / 4.2)
    assert expected_seconds("Hello there, world") == pytest.approx(3 / 2.7)
    assert expected_seconds("你好 world") == pytest.approx(2 / 4.2 + 1 / 2.7)


def test_expected_tokens_are_fifty_per_second_at_least_one():
    assert expected_tokens("你好。") == 24  # 2 / 4.2 s * 50 = 23.8
    assert expected_tokens("Hello there.") == 38  # 2 / 2.7 s * 50 = 37.04
    assert expected_tokens("...") == 1
    text = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
    assert count_cjk_syllables(text) == 27
    assert expected_tokens(text) == 322  # 27 / 4.2 s * 50 = 321.4


def test_torch_backend_writes_wavs_of_its_tokens(torch_run):
    log_dir, report = torch_run
    assert [r["batch_size"] for r in report["results"]] == [1, 2]
    for result in report["results"]:
        _assert_wavs_match_tokens(log_dir, "torch", result)
        assert result["batches"] == (3 if result["batch_size"] == 1 else 2)
        assert all(0 < r["tokens"] <= 6 for r in result["records"])


def test_report_fields_and_arithmetic(torch_run, capsys):
    log_dir, report = torch_run
    for key in ("device", "device_name", "torch_version", "dtype", "settings", "warmup_note"):
        assert report[key]
    assert report["dtype"] == "float32" and report["settings"]["max_new_tokens"] == 6
    for result in report["results"]:
        assert result["rows"] == 3
        assert result["rtf"] == pytest.approx(result["wall_s"] / result["audio_s"])
        stages = result["tokenizer_s"] + result["llm_s"] + result["vocoder_s"]
        assert 0 < stages <= result["wall_s"]
        assert sum(result["share"].values()) <= 1 + 1e-9
        assert result["share"]["llm"] == pytest.approx(result["llm_s"] / result["wall_s"])
        assert result["tokens"] == sum(r["tokens"] for r in result["records"])
        assert result["audio_s"] == pytest.approx(sum(r["audio_s"] for r in result["records"]))
        assert result["llm_tokens_per_s"] == pytest.approx(result["tokens"] / result["llm_s"])
        assert result["warmup"]["rows"] == result["batch_size"]
        assert result["warmup"]["wall_s"] > 0
    table = (log_dir / "offline_torch.md").read_text().splitlines()
    assert table[0].startswith("| Backend | Batch size | Rows | Audio s | Wall s | RTF |")
    assert len(table) == 4 and table[2].startswith("| torch | 1 | 3 |")


def test_realistic_lengths_force_the_estimated_token_count(spark_tiny_dir, dataset, tmp_path):
    assert _run(spark_tiny_dir, dataset, tmp_path, "--batch-sizes", "2", "--realistic-lengths") == 0
    (result,) = _report(tmp_path, "torch")["results"]
    by_id = {r["id"]: r for r in result["records"]}
    for i, text in enumerate(TARGETS):
        assert by_id[f"u{i}"]["forced_tokens"] == expected_tokens(text)
        assert by_id[f"u{i}"]["tokens"] == expected_tokens(text)
    _assert_wavs_match_tokens(tmp_path, "torch", result)


def test_hf_backend_at_batch_size_two(spark_tiny_dir, dataset, tmp_path):
    assert (
        _run(
            spark_tiny_dir,
            dataset,
            tmp_path,
            "--backend",
            "hf",
            "--batch-sizes",
            "2",
            "--max-new-tokens",
            "5",
        )
        == 0
    )
    report = _report(tmp_path, "hf")
    (result,) = report["results"]
    assert result["rows"] == 3 and result["batches"] == 2
    assert all(0 < r["tokens"] <= 5 for r in result["records"])
    _assert_wavs_match_tokens(tmp_path, "hf", result)
    assert (tmp_path / "offline_hf.md").read_text().splitlines()[2].startswith("| hf | 2 | 3 |")


@pytest.mark.skipif(trtllm_available(), reason="TensorRT-LLM is installed here")
def test_trtllm_without_tensorrt_llm_exits_2_with_one_line(spark_tiny_dir, dataset, tmp_path, capsys):
    assert _run(spark_tiny_dir, dataset, tmp_path, "--backend", "trtllm") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tensorrt_llm" in err


def test_runtime_does_not_import_transformers():
    code = (
        "import sys, runpy; runpy.run_path('offline_inference.py'); import tritontts.bench.offline; "
        "bad = [m for m in ('transformers', 'torchaudio', 'librosa') if m in sys.modules]; "
        "sys.exit(str(bad) if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


COSYVOICE2_SAMPLES_PER_TOKEN = 2 * 480  # two 24 kHz mel frames of 480 samples per speech token


@pytest.fixture(scope="module")
def cosyvoice2_tiny_dir(tmp_path_factory) -> Path:
    from tritontts.synthetic.cosyvoice2 import write_cosyvoice2_checkpoint

    return write_cosyvoice2_checkpoint(tmp_path_factory.mktemp("cosyvoice2_tiny"), "tiny", 0).root


def _run_cosyvoice2(model_root: Path, dataset: Path, log_dir: Path, *extra: str) -> dict:
    rc = _run(model_root, dataset, log_dir, "--model", "cosyvoice2", *extra)
    assert rc == 0
    backend = extra[extra.index("--backend") + 1] if "--backend" in extra else "torch"
    return json.loads((log_dir / f"offline_cosyvoice2_{backend}.json").read_text())


def test_cosyvoice2_realistic_lengths_give_24k_audio_of_25_tokens_per_second(
    cosyvoice2_tiny_dir, dataset, tmp_path
):
    report = _run_cosyvoice2(
        cosyvoice2_tiny_dir, dataset, tmp_path, "--batch-sizes", "2", "--realistic-lengths"
    )
    assert (report["model"], report["stages"]) == ("cosyvoice2", ["frontend", "llm", "token2wav"])
    assert report["token2wav_dtype"] == "float32" and report["settings"]["token_rate"] == 25
    assert report["settings"]["sampling"]["repetition_penalty"] == pytest.approx(1.1)
    (result,) = report["results"]
    assert (result["rows"], result["batches"]) == (3, 2)
    stages = result["frontend_s"] + result["llm_s"] + result["token2wav_s"]
    assert 0 < stages <= result["wall_s"]
    assert result["rtf"] == pytest.approx(result["wall_s"] / result["audio_s"])
    by_id = {r["id"]: r for r in result["records"]}
    for i, text in enumerate(TARGETS):
        record = by_id[f"u{i}"]
        assert record["forced_tokens"] == record["tokens"] == expected_tokens(text, 25)
        assert record["speech_tokens"] == record["tokens"]
        wav, rate = soundfile.read(tmp_path / "torch_bs2" / f"u{i}.wav")
        assert rate == 24000 and len(wav) == COSYVOICE2_SAMPLES_PER_TOKEN * record["speech_tokens"]
    assert result["speech_tokens"] == sum(r["speech_tokens"] for r in result["records"])
    table = (tmp_path / "offline_cosyvoice2_torch.md").read_text().splitlines()
    assert table[0].startswith(
        "| Backend | Batch size | Rows | Audio s | Wall s | RTF | Front end s | LLM s |"
    )
    assert "| Token2wav s |" in table[0] and table[2].startswith("| torch | 2 | 3 |")


def test_cosyvoice2_hf_backend_stops_at_the_cap(cosyvoice2_tiny_dir, dataset, tmp_path):
    report = _run_cosyvoice2(
        cosyvoice2_tiny_dir,
        dataset,
        tmp_path,
        "--backend",
        "hf",
        "--batch-sizes",
        "3",
        "--max-new-tokens",
        "4",
    )
    (result,) = report["results"]
    assert all(0 < r["tokens"] <= 4 for r in result["records"])
    for record in result["records"]:
        wav, rate = soundfile.read(record["wav"])
        assert rate == 24000 and len(wav) == COSYVOICE2_SAMPLES_PER_TOKEN * record["speech_tokens"]


def test_cosyvoice2_model_dir_must_hold_both_folders(spark_tiny_dir, dataset, tmp_path, capsys):
    assert _run(spark_tiny_dir, dataset, tmp_path, "--model", "cosyvoice2") == 1
    err = capsys.readouterr().err
    assert "CosyVoice2-0.5B" in err and "cosyvoice2_llm" in err
