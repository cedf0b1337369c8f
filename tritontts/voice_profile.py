"""Voice profiles: what a BLS computes from a reference audio, kept so later requests skip those models.

A profile belongs to one model family (`kind`) and to the checkpoint files it was made with (`checkpoint`, a
marker of those files). Per kind, the arrays and the BLS inputs and outputs that carry them:

- `spark_tts`: `global_tokens` int32 [32] and `semantic_tokens` int32 [n] (the BiCodec audio_tokenizer's);
- `cosyvoice2`: `speech_tokens` int32 [n], `speech_feat` float32 [2 n, 80] and `spk_embedding` float32 [192]
  (audio_tokenizer, the prompt mel, speaker_embedding; tokens and mel already cut to each other);
- `cosyvoice2_dit`: `speech_tokens` int32 [n] (uncut; token2wav_dit still takes the reference audio itself);
- `cosyvoice3`: as `cosyvoice2`, with CosyVoice3's speech tokens (speech_tokenizer_v3) and prompt mel (its own
  mel settings, cosyvoice3.yaml).

On the wire a profile goes into a BLS as inputs `voice_<array>` (batch dimension first) plus `voice_checkpoint`,
and comes out of a `voice_profile` request as outputs `profile_<array>` plus `profile_checkpoint`.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PROFILE_FORMAT = 1
KIND_ARRAYS: dict[str, tuple[str, ...]] = {
    "spark_tts": ("global_tokens", "semantic_tokens"),
    "cosyvoice2": ("speech_tokens", "speech_feat", "spk_embedding"),
    "cosyvoice2_dit": ("speech_tokens",),
    "cosyvoice3": ("speech_tokens", "speech_feat", "spk_embedding"),
}
NEEDS_REFERENCE_AUDIO = frozenset({"cosyvoice2_dit"})
"""Kinds whose BLS still needs the reference audio next to the profile (a token2wav that makes its own prompt)."""
ARRAY_DTYPES = {
    "global_tokens": np.int32,
    "semantic_tokens": np.int32,
    "speech_tokens": np.int32,
    "speech_feat": np.float32,
    "spk_embedding": np.float32,
}
INPUT_PREFIX, OUTPUT_PREFIX = "voice_", "profile_"
CHECKPOINT_INPUT, CHECKPOINT_OUTPUT = "voice_checkpoint", "profile_checkpoint"
PROFILE_PARAMETER = "voice_profile"
"""The request parameter (bool) that asks a BLS for the profile of the request's reference instead of audio."""
_EDGE_BYTES = 1 << 20


class ProfileError(ValueError):
    """A profile that does not fit its kind, or a file that is not a profile."""


def checkpoint_marker(root: str | Path, exclude: Iterable[str | Path] = ()) -> str:
    """A marker of the files under `root` (minus `exclude`): their relative paths, sizes and the first and last
    MiB of each, hashed. Any re-download, conversion or edit of a weight file changes it; reading 2 MiB per file
    keeps it cheap for multi-GB checkpoints."""
    root = Path(root).resolve()
    skip = [Path(p).resolve() for p in exclude]
    digest = hashlib.sha256(f"tritontts-voice-profile-{PROFILE_FORMAT}".encode())
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint directory {root} does not exist")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        resolved = path.resolve()
        if any(resolved == s or s in resolved.parents for s in skip) or path.name.startswith("."):
            continue
        size = path.stat().st_size
        digest.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
        with path.open("rb") as handle:
            digest.update(handle.read(_EDGE_BYTES))
            if size > 2 * _EDGE_BYTES:
                handle.seek(size - _EDGE_BYTES)
                digest.update(handle.read(_EDGE_BYTES))
    return digest.hexdigest()[:24]


@dataclass(frozen=True)
class VoiceProfile:
    kind: str
    checkpoint: str
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KIND_ARRAYS:
            raise ProfileError(f"kind must be one of {', '.join(KIND_ARRAYS)}, got {self.kind!r}")
        missing = [name for name in KIND_ARRAYS[self.kind] if name not in self.arrays]
        if missing:
            raise ProfileError(f"a {self.kind} profile needs {', '.join(missing)}")
        if not self.checkpoint:
            raise ProfileError("a profile needs the marker of the checkpoint it was made with")

    def to_bytes(self) -> bytes:
        buffer = io.BytesIO()
        arrays = {
            name: np.asarray(self.arrays[name], dtype=ARRAY_DTYPES[name]) for name in KIND_ARRAYS[self.kind]
        }
        meta = np.array([str(PROFILE_FORMAT), self.kind, self.checkpoint])
        np.savez(buffer, __meta__=meta, **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "profile") -> VoiceProfile:
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                meta = [str(v) for v in npz["__meta__"].tolist()]
                arrays = {name: npz[name] for name in npz.files if name != "__meta__"}
        except (OSError, ValueError, KeyError) as err:
            raise ProfileError(f"{source} is not a voice profile: {err}") from err
        if len(meta) != 3 or meta[0] != str(PROFILE_FORMAT):
            raise ProfileError(f"{source} has profile format {meta[:1]}, this version reads {PROFILE_FORMAT}")
        return cls(meta[1], meta[2], arrays)

    def request_arrays(self) -> dict[str, np.ndarray]:
        """The BLS inputs carrying this profile, batch dimension first."""
        arrays = {
            INPUT_PREFIX + name: np.asarray(self.arrays[name], dtype=ARRAY_DTYPES[name])[None]
            for name in KIND_ARRAYS[self.kind]
        }
        arrays[CHECKPOINT_INPUT] = np.array([[self.checkpoint.encode()]], dtype=object)
        return arrays

    @classmethod
    def from_outputs(cls, kind: str, outputs: Mapping[str, np.ndarray]) -> VoiceProfile:
        """From a `voice_profile` response's `profile_*` outputs (batch dimension first)."""
        checkpoint = outputs.get(CHECKPOINT_OUTPUT)
        if checkpoint is None:
            raise ProfileError(f"the response has no {CHECKPOINT_OUTPUT}")
        value = checkpoint.reshape(-1)[0]
        marker = value.decode() if isinstance(value, bytes) else str(value)
        arrays = {}
        for name in KIND_ARRAYS.get(kind, ()):
            array = outputs.get(OUTPUT_PREFIX + name)
            if array is None:
                raise ProfileError(f"the response has no {OUTPUT_PREFIX + name}")
            arrays[name] = np.asarray(array)[0]
        return cls(kind, marker, arrays)
