"""The `yuekai/seed_tts_cosy2` schema: the seed_tts columns plus CosyVoice2 speech tokens of prompt and target."""

import io
import json

import numpy as np
import pytest
import soundfile

from tritontts.bench.dataset import (
    COLUMNS,
    COSY2_TOKEN_COLUMNS,
    DatasetError,
    Utterance,
    load_utterances,
    to_arrow_table,
    write_hf_copies,
)

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyarrow.parquet")
SPLIT = "wenetspeech4tts"


def _wav_bytes(seconds: float, rate: int = 16000) -> bytes:
    buffer = io.BytesIO()
    t = np.arange(int(seconds * rate)) / rate
    soundfile.write(buffer, 0.3 * np.sin(2 * np.pi * 200 * t), rate, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def upstream_like_table(token_type=None) -> "pa.Table":
    """Columns as upstream's scripts read them, in hub order, with a target audio column we do not read."""
    token_type = token_type or pa.list_(pa.int64())
    audio = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    return pa.table(
        {
            "id": ["10002287-00000095", "10004035-00000024"],
            "prompt_text": ["在此奉劝大家别乱打美白针。", "就是为了让我们一起"],
            "prompt_audio": pa.array(
                [{"bytes": _wav_bytes(1.0), "path": "a.wav"}, {"bytes": _wav_bytes(0.5), "path": "b.wav"}],
                audio,
            ),
            "target_text": ["简单地说，这相当于惠普把消费领域市场拱手相让了。", "你好。"],
            "target_audio": pa.array([{"bytes": b"", "path": "x.wav"}] * 2, audio),
            "prompt_audio_cosy2_tokens": pa.array([[4218, 0, 6560], [17]], token_type),
            "target_audio_cosy2_tokens": pa.array([[1, 2, 3, 4], []], token_type),
        }
    )


def test_cosy2_parquet_loads_with_its_token_columns(tmp_path):
    path = tmp_path / f"{SPLIT}.parquet"
    pa.parquet.write_table(upstream_like_table(), str(path))
    rows = load_utterances(path, SPLIT)
    assert [r.id for r in rows] == ["10002287-00000095", "10004035-00000024"]
    assert rows[0].sample_rate == 16000 and rows[0].prompt_audio.size == 16000
    np.testing.assert_array_equal(rows[0].prompt_tokens, [4218, 0, 6560])
    np.testing.assert_array_equal(rows[1].target_tokens, np.zeros(0))
    assert all(r.prompt_tokens.dtype == np.int32 and r.target_tokens.dtype == np.int32 for r in rows)


def test_seed_tts_rows_have_no_tokens(tmp_path):
    path = tmp_path / "plain.parquet"
    pa.parquet.write_table(upstream_like_table().drop_columns(list(COSY2_TOKEN_COLUMNS)), str(path))
    rows = load_utterances(path, SPLIT)
    assert len(rows) == 2 and all(r.prompt_tokens is None and r.target_tokens is None for r in rows)


def test_tokens_that_are_not_integers_are_refused(tmp_path):
    path = tmp_path / "bad.parquet"
    pa.parquet.write_table(upstream_like_table(pa.list_(pa.float32())), str(path))
    with pytest.raises(DatasetError, match="prompt_audio_cosy2_tokens"):
        load_utterances(path, SPLIT)


def _rows() -> list[Utterance]:
    wav = np.linspace(-0.5, 0.5, 8000, dtype=np.float32)
    return [
        Utterance(
            f"u{i}", "参考。", wav, 16000, "目标。", np.arange(i + 2, dtype=np.int32), np.full(i + 1, 9)
        )
        for i in range(3)
    ]


def test_cosy2_copies_round_trip_through_both_local_formats(tmp_path):
    rows = _rows()
    table = to_arrow_table(rows)
    assert table.column_names == [*COLUMNS, *COSY2_TOKEN_COLUMNS]
    written = write_hf_copies(rows, tmp_path, SPLIT)
    features = json.loads((tmp_path / "hf" / SPLIT / "dataset_info.json").read_text())["features"]
    assert set(COSY2_TOKEN_COLUMNS) <= set(features)
    for source in written.values():
        back = load_utterances(source, SPLIT)
        for got, want in zip(back, rows, strict=True):
            np.testing.assert_array_equal(got.prompt_tokens, want.prompt_tokens)
            np.testing.assert_array_equal(got.target_tokens, want.target_tokens)


def test_datasets_reads_the_cosy2_copy(tmp_path):
    datasets = pytest.importorskip("datasets")
    write_hf_copies(_rows(), tmp_path, SPLIT)
    loaded = datasets.load_from_disk(str(tmp_path / "hf"))[SPLIT]
    assert isinstance(loaded.features["prompt_audio"], datasets.Audio)
    loaded = loaded.select_columns(list(COSY2_TOKEN_COLUMNS))  # no audio decoding (torchcodec) needed
    assert loaded[2]["prompt_audio_cosy2_tokens"] == [0, 1, 2, 3]
    assert loaded[0]["target_audio_cosy2_tokens"] == [9]


def test_rows_without_tokens_write_the_seed_tts_schema():
    rows = [Utterance("u", "a", np.zeros(160, dtype=np.float32), 16000, "b")]
    assert to_arrow_table(rows).column_names == list(COLUMNS)
