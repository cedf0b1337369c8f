"""Voices shared by the instances of one model: one file per voice in one folder.

Each BLS instance is its own process with its own `VoiceCache`, so a new reference voice used to run the front
end once per instance (16 instances: up to 16 times). The store behind the caches keeps each computed voice as an
`.npz` of its dataclass fields (arrays and strings, no pickles), written to a temporary file and renamed into
place, so an instance reads a whole file or none; past `capacity` files the least recently used are deleted.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from tritontts.processes import pid_alive

log = logging.getLogger(__name__)

V = TypeVar("V")
_KEY = re.compile(r"[0-9a-f]{16,128}")


def to_arrays(value: Any) -> dict[str, np.ndarray]:
    """A dataclass's fields that are set (arrays, strings, numbers) as arrays."""
    return {
        field.name: np.asarray(getattr(value, field.name))
        for field in dataclasses.fields(value)
        if getattr(value, field.name) is not None
    }


def from_arrays(value_type: type[V], arrays: dict[str, np.ndarray]) -> V:
    """`value_type` from `to_arrays`' arrays; a missing field takes its default (KeyError where it has none)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(value_type):  # type: ignore[arg-type]
        if field.name not in arrays:
            if field.default is dataclasses.MISSING:
                raise KeyError(field.name)
            continue
        array = arrays[field.name]
        values[field.name] = array.item() if array.ndim == 0 else array
    return value_type(**values)

    return True


def server_folder(model_name: str, root: Path | None = None) -> Path:
    """`<tmp>/tritontts-voices-<uid>/<model>-<server pid>`: one folder per model of one running tritonserver (the
    stubs' parent); folders of servers that are gone are removed."""
    root = root or Path(tempfile.gettempdir()) / f"tritontts-voices-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    for old in root.glob(f"{model_name}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return root / f"{model_name}-{os.getppid()}"


def _warm_npz_reading() -> None:
    """Reads a small .npz from memory: a process's first np.load of one (zipfile's codec import, numpy's first
    calls) costs several times a later one, which each BLS instance's first stored voice paid."""
    buffer = io.BytesIO()
    np.savez(buffer, warm=np.zeros(1, dtype=np.int32))
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as data:
        data["warm"]


class SharedVoiceStore(Generic[V]):
    """`load(key)` / `save(key, value)` of `value_type` (a dataclass) values in `directory`."""

    def __init__(self, directory: Path, value_type: type[V], capacity: int = 256) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.value_type = value_type
        self.capacity = capacity
        _warm_npz_reading()

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"a voice key is a hex digest, got {key!r}")
        return self.directory / f"{key}.npz"

    def load(self, key: str) -> V | None:
        path = self._path(key)
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = {name: data[name] for name in data.files}
            os.utime(path)
            return from_arrays(self.value_type, arrays)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
            log.warning("voice store: %s unreadable (%s); computing it again", path.name, err)
            return None

    def save(self, key: str, value: V) -> None:
        path, written = self._path(key), ""
        try:
            with tempfile.NamedTemporaryFile(dir=self.directory, suffix=".tmp", delete=False) as tmp:
                written = tmp.name
                np.savez(tmp, **to_arrays(value))
            os.replace(written, path)
        except OSError as err:
            log.warning("voice store: %s not saved (%s)", path.name, err)
            if written:
                Path(written).unlink(missing_ok=True)
            return
        self._evict()

    def _evict(self) -> None:
        files = list(self.directory.glob("*.npz"))
        if len(files) <= self.capacity:
            return

        def mtime(path: Path) -> float:
            try:
                return path.stat().st_mtime
            except FileNotFoundError:
                return 0.0

        for old in sorted(files, key=mtime)[: len(files) - self.capacity]:
            old.unlink(missing_ok=True)

    def __len__(self) -> int:
        return len(list(self.directory.glob("*.npz")))


def voice_store(
    setting: str, model_name: str, value_type: type[V], capacity: int = 256
) -> SharedVoiceStore[V] | None:
    """A BLS's `voice_cache_dir` parameter: `auto` (a folder per model of this tritonserver, see
    `server_folder`), `none` (each instance keeps its own voices) or a folder; None where the store is off or
    its folder cannot be made (logged: the instances then keep their own)."""
    if setting in ("none", "") or capacity <= 0:
        return None
    try:
        folder = server_folder(model_name) if setting == "auto" else Path(setting)
        return SharedVoiceStore(folder, value_type, capacity)
    except OSError as err:
        log.warning("voice store for %s off: %s", model_name, err)
        return None
