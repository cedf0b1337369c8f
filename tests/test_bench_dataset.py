import importlib.util
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile

from tritontts.bench import dataset as bench_dataset
from tritontts.bench.dataset import COLUMNS, DatasetError, load_manifest, load_utterances
from tritontts.bench.triton_io import REFERENCE_SAMPLE_RATE, reference_samples

REPO = Path(__file__).resolve().parents[1]
PROMPT_WAV = REPO / "../shared/data/prompt_zh.wav"
SPLIT = "wenetspeech4tts"

pytestmark = pytest.mark.skipif(not PROMPT_WAV.is_file(), reason="needs ../shared/data/prompt_zh.wav")


def make_data(output_dir: Path, *extra: str) -> None:
    spec = importlib.util.spec_from_file_location(
        "make_benchmark_data", REPO / "scripts/make_benchmark_data.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = ["--output-dir", str(output_dir), "--prompt-wav", str(PROMPT_WAV), "--split-name", SPLIT, *extra]
    assert script.main(argv) == 0


def pyarrow_works() -> bool:
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return False
    return True


def test_manifest_dataset_loads_back_with_the_schema(tmp_path):
    make_data(tmp_path, "--no-espeak", "--num-rows", "5", "--manifest-only")
    rows = load_utterances(tmp_path, SPLIT)
    assert [r.id for r in rows] == [f"{i:03d}_zh" for i in range(5)]
    prompt, rate = soundfile.read(PROMPT_WAV, dtype="float32")
    for row in rows:
        assert row.prompt_text.startswith("吃燕窝就选燕之屋")
        assert row.target_text
        assert row.sample_rate == rate == REFERENCE_SAMPLE_RATE
        np.testing.assert_allclose(row.prompt_audio, prompt, atol=1 / 32768)
    assert len({r.target_text for r in rows}) == 5
    assert any(t.isascii() for t in (r.target_text for r in rows))
    assert [r.id for r in load_manifest(tmp_path / "manifest.txt")] == [r.id for r in rows]


@pytest.mark.skipif(not pyarrow_works(), reason="pyarrow cannot be imported")
def test_parquet_and_save_to_disk_copies_load_back(tmp_path):
    make_data(tmp_path, "--no-espeak", "--num-rows", "4")
    expected = load_utterances(tmp_path / "manifest.txt", SPLIT)
    for source in (tmp_path / "hf", tmp_path / "parquet", tmp_path / "parquet" / f"{SPLIT}.parquet"):
        rows = load_utterances(source, SPLIT)
        assert [r.id for r in rows] == [r.id for r in expected]
        for got, want in zip(rows, expected):
            assert (got.prompt_text, got.target_text, got.sample_rate) == (
                want.prompt_text,
                want.target_text,
                want.sample_rate,
            )
            np.testing.assert_array_equal(got.prompt_audio, want.prompt_audio)
    import pyarrow.parquet

    table = pyarrow.parquet.read_table(tmp_path / "parquet" / f"{SPLIT}.parquet")
    assert table.column_names == list(COLUMNS)
    with pytest.raises(DatasetError, match="splits"):
        load_utterances(tmp_path / "hf", "test_zh")


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed")
def test_espeak_prompts_are_english_and_resampled_to_16k(tmp_path):
    make_data(tmp_path, "--num-rows", "3", "--manifest-only")
    rows = load_utterances(tmp_path, SPLIT)
    assert [r.id for r in rows] == ["000_zh", "001_en_us", "002_en_gb"]
    english = rows[1]
    assert english.prompt_text.isascii() and english.sample_rate != REFERENCE_SAMPLE_RATE
    samples = reference_samples(english.prompt_audio, english.sample_rate)
    assert samples.dtype == np.float32
    assert samples.size == math.ceil(english.prompt_audio.size * REFERENCE_SAMPLE_RATE / english.sample_rate)
    assert np.abs(samples).max() > 0.01


def test_unreachable_hub_points_to_the_local_data_script(monkeypatch):
    class OfflineDatasets:
        @staticmethod
        def load_dataset(name, split):
            raise ConnectionError(f"Couldn't reach '{name}' on the Hub")

    monkeypatch.setattr(bench_dataset, "_import_datasets", lambda: OfflineDatasets)
    with pytest.raises(DatasetError, match="make_benchmark_data.py"):
        load_utterances("yuekai/seed_tts", SPLIT)


def test_bad_manifest_line_names_the_line(tmp_path):
    manifest = tmp_path / "manifest.txt"
    manifest.write_text("only|three|fields\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="manifest.txt:1"):
        load_manifest(manifest)
