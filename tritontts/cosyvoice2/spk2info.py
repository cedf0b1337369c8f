"""`spk2info.pt`: cached reference speakers, so a request can name a voice instead of sending audio.

Upstream's Triton runtime loads `<model_dir>/spk2info.pt` (the file async_cosyvoice publishes for
CosyVoice2-0.5B) and uses speaker "001" when a request has no reference audio: the BLS reads `prompt_text`
and `speech_token`, token2wav reads `speech_token`, `speech_feat` and `embedding`. Each speaker is a dict of
plain values and tensors, so the file loads with `weights_only=True`.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.frontend import EMBEDDING_DIM, FEAT_FRAMES_PER_TOKEN, PromptFeatures
from tritontts.cosyvoice2.prompt import check_speech_tokens

SPK2INFO_FILE = "spk2info.pt"
DEFAULT_SPEAKER = "001"
MEL_BINS = 80


@dataclass(frozen=True)
class CachedSpeaker:
    """One speaker, shaped as upstream keeps it (batch dimension of 1 first)."""

    prompt_text: str
    speech_token: torch.Tensor
    """int32 `[1, T]`, ids in 0..6560"""
    speech_feat: torch.Tensor
    """fp32 `[1, 2 T, 80]`"""
    embedding: torch.Tensor
    """fp32 `[1, 192]`"""
    prompt_text_token: torch.Tensor | None = None
    """int32 `[1, N]`: `prompt_text` through the LLM tokenizer"""
    name: str | None = None

    def __post_init__(self) -> None:
        tokens, feat, emb = self.speech_token, self.speech_feat, self.embedding
        if tokens.ndim != 2 or tokens.shape[0] != 1 or tokens.dtype.is_floating_point:
            raise ValueError(f"speech_token must be integer [1, T], got {tokens.dtype} {tuple(tokens.shape)}")
        check_speech_tokens(tokens[0].tolist(), "speech_token")
        frames = FEAT_FRAMES_PER_TOKEN * tokens.shape[1]
        if tuple(feat.shape) != (1, frames, MEL_BINS):
            raise ValueError(f"speech_feat must be [1, {frames}, {MEL_BINS}], got {tuple(feat.shape)}")
        if tuple(emb.shape) != (1, EMBEDDING_DIM):
            raise ValueError(f"embedding must be [1, {EMBEDDING_DIM}], got {tuple(emb.shape)}")

    @classmethod
    def from_features(
        cls, features: PromptFeatures, prompt_text: str, prompt_text_token: list[int] | None = None
    ) -> CachedSpeaker:
        """From the front end's output for one reference waveform and its transcript."""
        text_tokens = None
        if prompt_text_token is not None:
            text_tokens = torch.tensor([prompt_text_token], dtype=torch.int32)
        return cls(
            prompt_text=prompt_text,
            speech_token=torch.from_numpy(np.asarray(features.speech_tokens, dtype=np.int32))[None],
            speech_feat=torch.from_numpy(np.asarray(features.speech_feat, dtype=np.float32))[None],
            embedding=torch.from_numpy(np.asarray(features.spk_embedding, dtype=np.float32)).reshape(1, -1),
            prompt_text_token=text_tokens,
        )

    def to_dict(self, spk_id: str) -> dict:
        entry = {"name": self.name, "spk_id": spk_id, "prompt_text": self.prompt_text}
        if self.prompt_text_token is not None:
            entry["prompt_text_token"] = self.prompt_text_token.to(torch.int32).contiguous()
        return entry | {
            "speech_feat": self.speech_feat.to(torch.float32).contiguous(),
            "speech_token": self.speech_token.to(torch.int32).contiguous(),
            "embedding": self.embedding.to(torch.float32).contiguous(),
        }

    @classmethod
    def from_dict(cls, raw: Mapping, source: str) -> CachedSpeaker:
        """CheckpointError naming `source` and the key when one is missing or ill-shaped."""
        missing = [k for k in ("prompt_text", "speech_token", "speech_feat", "embedding") if k not in raw]
        if missing:
            raise CheckpointError(f"{source}: missing keys: {', '.join(missing)}")
        if not isinstance(raw["prompt_text"], str):
            raise CheckpointError(f"{source}: prompt_text is {type(raw['prompt_text']).__name__}, not str")
        tensors = ("speech_token", "speech_feat", "embedding", "prompt_text_token")
        for key in tensors:
            if key in raw and raw[key] is not None and not isinstance(raw[key], torch.Tensor):
                raise CheckpointError(f"{source}: {key} is {type(raw[key]).__name__}, not a tensor")
        text_tokens = raw.get("prompt_text_token")
        try:
            return cls(
                prompt_text=raw["prompt_text"],
                speech_token=raw["speech_token"].to(torch.int32),
                speech_feat=raw["speech_feat"].to(torch.float32),
                embedding=raw["embedding"].to(torch.float32),
                prompt_text_token=None if text_tokens is None else text_tokens.to(torch.int32),
                name=raw.get("name"),
            )
        except ValueError as error:
            raise CheckpointError(f"{source}: {error}") from None


def load_spk2info(path: str | Path) -> dict[str, CachedSpeaker]:
    """Every speaker of a spk2info.pt, checked; loads with `weights_only=True` and says so when that fails."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"speaker cache not found: {path}")
    try:
        raw = torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"{path} holds objects other than dicts, strings and tensors, so it was not unpickled "
            f"(weights_only=True). Rewrite it with save_spk2info, or re-save its dicts from a trusted "
            f"session. torch said: {str(error).splitlines()[0]}"
        ) from None
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise CheckpointError(f"{path} is not a dict of speaker id -> dict")
    return {
        str(spk_id): CachedSpeaker.from_dict(entry, f"{path}[{spk_id!r}]") for spk_id, entry in raw.items()
    }


def save_spk2info(path: str | Path, speakers: Mapping[str, CachedSpeaker]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({spk_id: speaker.to_dict(spk_id) for spk_id, speaker in speakers.items()}, str(path))
    return path
