"""Benchmark data in the `yuekai/seed_tts` and `yuekai/seed_tts_cosy2` schemas: loading it from the hub, from
local copies or from a manifest, and writing a local copy.

A row has `id`, `prompt_text`, `prompt_audio` (a datasets Audio value: {"array", "sampling_rate"} when
decoded, {"bytes", "path"} when not) and `target_text`. The cosy2 schema adds `prompt_audio_cosy2_tokens` and
`target_audio_cosy2_tokens`: CosyVoice2 speech tokens (0..6560, 25 per second) of the prompt audio and of the
recorded target, as upstream's scripts read them; they are kept when present. A manifest is upstream's text
format, one `id|prompt_text|prompt_wav|target_text` per line, wav paths relative to the manifest's folder.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile

COLUMNS = ("id", "prompt_text", "prompt_audio", "target_text")
COSY2_TOKEN_COLUMNS = ("prompt_audio_cosy2_tokens", "target_audio_cosy2_tokens")
READ_COLUMNS = (*COLUMNS, *COSY2_TOKEN_COLUMNS)
MANIFEST_NAME = "manifest.txt"
LOCAL_DATA_HINT = (
    "run `python scripts/make_benchmark_data.py` and pass --huggingface-dataset <its output dir>"
)


class DatasetError(RuntimeError):
    """Benchmark data that cannot be loaded; the message says why and what to do."""


@dataclass(frozen=True)
class Utterance:
    id: str
    prompt_text: str
    prompt_audio: np.ndarray
    sample_rate: int
    target_text: str
    prompt_tokens: np.ndarray | None = None
    """int32 CosyVoice2 speech tokens of the prompt audio (cosy2 schema only)"""
    target_tokens: np.ndarray | None = None
    """int32 CosyVoice2 speech tokens of the recorded target (cosy2 schema only)"""


def decode_audio(value: dict | str | Path) -> tuple[np.ndarray, int]:
    """Float32 mono samples and their rate from a datasets Audio value (decoded or not) or a file path."""
    if isinstance(value, dict) and value.get("array") is not None:
        return np.asarray(value["array"], dtype=np.float32), int(value["sampling_rate"])
    if isinstance(value, dict):
        source = io.BytesIO(value["bytes"]) if value.get("bytes") else value.get("path")
    else:
        source = value
    if source is None:
        raise DatasetError("an audio value has neither samples, bytes nor a path")
    wav, rate = soundfile.read(source, dtype="float32", always_2d=True)
    return wav[:, 0], int(rate)


def _tokens(row: dict, column: str) -> np.ndarray | None:
    value = row.get(column)
    if value is None:
        return None
    tokens = np.asarray(value)
    if tokens.ndim != 1 or (tokens.size and not np.issubdtype(tokens.dtype, np.integer)):
        raise DatasetError(f"row {row['id']}: {column} must be a list of integers")
    return tokens.astype(np.int32)


def from_rows(rows: Iterable[dict]) -> list[Utterance]:
    utterances = []
    for row in rows:
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise DatasetError(
                f"dataset row lacks column(s) {missing}; the seed_tts schema needs {list(COLUMNS)}"
            )
        wav, rate = decode_audio(row["prompt_audio"])
        prompt_tokens, target_tokens = (_tokens(row, c) for c in COSY2_TOKEN_COLUMNS)
        utterances.append(
            Utterance(
                str(row["id"]),
                row["prompt_text"],
                wav,
                rate,
                row["target_text"],
                prompt_tokens,
                target_tokens,
            )
        )
    return utterances


def load_manifest(path: str | Path) -> list[Utterance]:
    path = Path(path)
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != 4:
            raise DatasetError(f"{path}:{number}: expected id|prompt_text|prompt_wav|target_text")
        utt, prompt_text, prompt_wav, target_text = fields
        wav_path = Path(prompt_wav) if Path(prompt_wav).is_absolute() else path.parent / prompt_wav
        rows.append(
            {
                "id": Path(utt).stem,
                "prompt_text": prompt_text,
                "prompt_audio": wav_path,
                "target_text": target_text,
            }
        )
    return from_rows(rows)


def _import_datasets():
    try:
        import datasets
    except ImportError as error:
        raise DatasetError(
            f"the `datasets` package cannot be imported ({error}); {LOCAL_DATA_HINT}"
        ) from error
    return datasets


def _import_pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise DatasetError(
            f"pyarrow cannot be imported ({error}); use the manifest (--manifest-path)"
        ) from error
    return pyarrow


def _has_datasets_files(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def _parquet_files(folder: Path, split: str) -> list[Path]:
    files = sorted(folder.rglob("*.parquet"))
    of_split = [f for f in files if f.stem.startswith(split) or split in f.relative_to(folder).parts[:-1]]
    return of_split or files


def _read_saved(folder: Path, split: str):
    """The arrow table of a `save_to_disk` folder, read with pyarrow (a Dataset, or one split of a DatasetDict)."""
    pa = _import_pyarrow()
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        if split not in splits:
            raise DatasetError(f"{folder} has splits {splits}, not '{split}'")
        folder = folder / split
    state = json.loads((folder / "state.json").read_text())
    tables = []
    for entry in state["_data_files"]:
        with pa.OSFile(str(folder / entry["filename"])) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return pa.concat_tables(tables)


def _from_table(table) -> list[Utterance]:
    """Only the schemas' columns are read: copies may hold more (such as audio of the targets)."""
    return from_rows(table.select([c for c in READ_COLUMNS if c in table.column_names]).to_pylist())


def load_utterances(source: str | Path, split: str) -> list[Utterance]:
    """Rows of `split` from a manifest file, a parquet file, a folder of parquet files, a `save_to_disk`
    folder (Dataset or DatasetDict) or, when `source` is no local path, the Hugging Face hub. Local copies
    are read with pyarrow and audio is decoded with soundfile, so no audio backend of `datasets` is needed."""
    path = Path(source)
    if path.is_file() and path.suffix != ".parquet":
        return load_manifest(path)
    if path.is_dir() and _has_datasets_files(path):
        return _from_table(_read_saved(path, split))
    if path.is_dir() and (path / MANIFEST_NAME).is_file():
        return load_manifest(path / MANIFEST_NAME)
    if path.exists():
        files = [path] if path.is_file() else _parquet_files(path, split)
        if not files:
            raise DatasetError(
                f"{path} holds no dataset: no save_to_disk files, parquet files or {MANIFEST_NAME}"
            )
        pa = _import_pyarrow()
        return _from_table(pa.concat_tables([pa.parquet.read_table(str(f)) for f in files]))
    return load_hub(str(source), split)


def load_hub(name: str, split: str) -> list[Utterance]:
    datasets = _import_datasets()
    try:
        dataset = datasets.load_dataset(name, split=split)
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DatasetError(
            f"cannot load '{name}' split '{split}' from the Hugging Face hub ({reason}); {LOCAL_DATA_HINT}"
        ) from error
    # Undecoded, so that soundfile reads the audio and no audio backend of `datasets` (torchcodec) is needed.
    dataset = dataset.select_columns([c for c in READ_COLUMNS if c in dataset.column_names])
    return from_rows(dataset.cast_column("prompt_audio", datasets.Audio(decode=False)))


def write_manifest(utterances: Sequence[Utterance], folder: Path) -> Path:
    """WAV files under `folder/wavs` and `folder/manifest.txt` pointing at them."""
    wav_dir = folder / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for u in utterances:
        for text in (u.id, u.prompt_text, u.target_text):
            if "|" in text or "\n" in text:
                raise DatasetError(f"row {u.id}: '|' and newlines cannot be written to a manifest")
        soundfile.write(wav_dir / f"{u.id}.wav", u.prompt_audio, u.sample_rate, subtype="PCM_16")
        lines.append(f"{u.id}|{u.prompt_text}|wavs/{u.id}.wav|{u.target_text}")
    manifest = folder / MANIFEST_NAME
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return manifest


HF_FEATURES = {
    "id": {"dtype": "string", "_type": "Value"},
    "prompt_text": {"dtype": "string", "_type": "Value"},
    "prompt_audio": {"_type": "Audio"},
    "target_text": {"dtype": "string", "_type": "Value"},
}
HF_TOKEN_FEATURE = {"feature": {"dtype": "int32", "_type": "Value"}, "_type": "Sequence"}


def is_cosy2(utterances: Sequence[Utterance]) -> bool:
    """Whether every row carries both token columns of the seed_tts_cosy2 schema."""
    return bool(utterances) and all(
        u.prompt_tokens is not None and u.target_tokens is not None for u in utterances
    )


def to_arrow_table(utterances: Sequence[Utterance]):
    """The rows as an arrow table in the seed_tts schema (seed_tts_cosy2 when every row has both token
    lists), audio as WAV bytes, with the `huggingface` schema metadata that makes `datasets` read
    `prompt_audio` as an Audio column."""
    pa = _import_pyarrow()
    audio = []
    for u in utterances:
        buffer = io.BytesIO()
        soundfile.write(buffer, u.prompt_audio, u.sample_rate, format="WAV", subtype="PCM_16")
        audio.append({"bytes": buffer.getvalue(), "path": f"{u.id}.wav"})
    fields = [
        ("id", pa.string()),
        ("prompt_text", pa.string()),
        ("prompt_audio", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        ("target_text", pa.string()),
    ]
    features = dict(HF_FEATURES)
    columns = {
        "id": [u.id for u in utterances],
        "prompt_text": [u.prompt_text for u in utterances],
        "prompt_audio": audio,
        "target_text": [u.target_text for u in utterances],
    }
    if is_cosy2(utterances):
        fields += [(c, pa.list_(pa.int32())) for c in COSY2_TOKEN_COLUMNS]
        features |= {c: HF_TOKEN_FEATURE for c in COSY2_TOKEN_COLUMNS}
        columns["prompt_audio_cosy2_tokens"] = [u.prompt_tokens.tolist() for u in utterances]
        columns["target_audio_cosy2_tokens"] = [u.target_tokens.tolist() for u in utterances]
    schema = pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": features}})})
    return pa.Table.from_pydict(columns, schema=schema)


def write_parquet(utterances: Sequence[Utterance], path: Path) -> Path:
    pa = _import_pyarrow()
    path.parent.mkdir(parents=True, exist_ok=True)
    pa.parquet.write_table(to_arrow_table(utterances), str(path))
    return path


def write_saved_dataset(utterances: Sequence[Utterance], folder: Path, split: str) -> Path:
    """A DatasetDict with one split in the `save_to_disk` layout (dataset_dict.json, <split>/state.json,
    dataset_info.json and one arrow stream file), loadable by `datasets.load_from_disk`."""
    pa = _import_pyarrow()
    table = to_arrow_table(utterances)
    split_dir = folder / split
    split_dir.mkdir(parents=True, exist_ok=True)
    data_file = "data-00000-of-00001.arrow"
    with pa.OSFile(str(split_dir / data_file), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    fingerprint = hashlib.sha256(
        b"".join(u.id.encode() + u.prompt_audio.tobytes() for u in utterances)
    ).hexdigest()
    state = {
        "_data_files": [{"filename": data_file}],
        "_fingerprint": fingerprint[:16],
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": split,
    }
    (split_dir / "state.json").write_text(json.dumps(state, indent=2))
    features = json.loads(table.schema.metadata[b"huggingface"])["info"]["features"]
    (split_dir / "dataset_info.json").write_text(json.dumps({"features": features, "splits": {}}, indent=2))
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": [split]}))
    return folder


def write_hf_copies(utterances: Sequence[Utterance], folder: Path, split: str) -> dict[str, Path]:
    """`folder/hf` (save_to_disk layout) and `folder/parquet/<split>.parquet`."""
    return {
        "save_to_disk": write_saved_dataset(utterances, folder / "hf", split),
        "parquet": write_parquet(utterances, folder / "parquet" / f"{split}.parquet"),
    }
