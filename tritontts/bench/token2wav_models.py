"""The two token2wav models the standalone token2wav benchmark drives, behind one small interface.

`cosyvoice2`: CosyVoice2's flow + HiFT (`CosyVoice2-0.5B/`); its speaker is the front end's prompt tokens,
prompt mel and x-vector, and a streamed call passes every target token so far with the chunk's offset.
`cosyvoice2_dit`: Step-Audio-2-mini's DiT flow + HiFT (`Step-Audio-2-mini/token2wav/`); its speaker is made
from the reference audio by the model itself, and a streamed call passes only the chunk's tokens (with its
look-ahead). Both return 24 kHz float32 audio, 960 samples per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from tritontts.bench.offline_cosyvoice2 import frontend_device
from tritontts.cosyvoice2.frontend import CosyVoice2Frontend
from tritontts.cosyvoice2.layout import MODEL_DIR
from tritontts.cosyvoice2.token2wav import CONFIG_FILE, StreamChunk, Token2Wav
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.dit_token2wav import DiTToken2Wav
from tritontts.dit_token2wav.config import FLOW_YAML
from tritontts.dit_token2wav.layout import TOKEN2WAV_DIR

SAMPLE_RATE = 24000
MODELS = ("cosyvoice2", "cosyvoice2_dit")
MODEL_FOLDERS = {"cosyvoice2": (MODEL_DIR, CONFIG_FILE), "cosyvoice2_dit": (TOKEN2WAV_DIR, FLOW_YAML)}


class Token2WavModel(Protocol):
    device: torch.device
    vocab_size: int
    pre_lookahead_len: int

    def prepare(self, wav_16k: np.ndarray) -> Any:
        """A speaker from a 16 kHz reference, computed anew on every call."""
        ...

    def offline(self, tokens: np.ndarray, speaker: Any) -> np.ndarray: ...

    def stream(self, request_id: str, tokens: np.ndarray, chunk: StreamChunk, speaker: Any) -> np.ndarray:
        """One call of a stream: `tokens` are all target tokens of the row; `chunk` says which part."""
        ...


def model_folder(root: str | Path, model: str) -> Path:
    """The model's folder under `root` as run.sh stage 0 writes it, or `root` itself when it is that folder."""
    if model not in MODEL_FOLDERS:
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
    root = Path(root)
    subdir, marker = MODEL_FOLDERS[model]
    for folder in (root / subdir, root):
        if (folder / marker).is_file():
            return folder
    raise FileNotFoundError(
        f"--model-dir {root}: no {marker} in {root / subdir} or {root}; for --model {model} it must hold "
        f"{subdir}/ (run.sh stage 0 writes it)"
    )


@dataclass(frozen=True)
class CosyVoice2Speaker:
    prompt_tokens: Tensor
    """int32 [1, n] on the device"""
    prompt_feat: Tensor
    """[1, 2n, 80] on the device"""
    embedding: Tensor
    """[1, 192] on the device"""


class CosyVoice2Model:
    def __init__(self, frontend: CosyVoice2Frontend, token2wav: Token2Wav) -> None:
        self.frontend = frontend
        self.token2wav = token2wav
        self.device = token2wav.device
        config = token2wav.flow.config
        self.vocab_size = config.vocab_size
        self.pre_lookahead_len = config.pre_lookahead_len

    @classmethod
    def load(
        cls,
        folder: Path,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        flow_graphs: FlowGraphConfig | None,
    ) -> CosyVoice2Model:
        frontend = CosyVoice2Frontend.from_model_dir(folder, tokenizer_device=frontend_device(device))
        return cls(
            frontend, Token2Wav.from_model_dir(folder, device, dtype, seed=seed, flow_graphs=flow_graphs)
        )

    def prepare(self, wav_16k: np.ndarray) -> CosyVoice2Speaker:
        features = self.frontend(wav_16k)
        return CosyVoice2Speaker(
            torch.from_numpy(features.speech_tokens[None]).to(self.device, torch.int32),
            torch.from_numpy(features.speech_feat[None]).to(self.device),
            torch.from_numpy(features.spk_embedding[None]).to(self.device),
        )

    def _audio(self, speech: Tensor) -> np.ndarray:
        return speech[0].float().cpu().numpy()

    def offline(self, tokens: np.ndarray, speaker: CosyVoice2Speaker) -> np.ndarray:
        target = torch.from_numpy(tokens[None]).to(self.device, torch.int32)
        return self._audio(
            self.token2wav.offline(target, speaker.prompt_tokens, speaker.prompt_feat, speaker.embedding)
        )

    def stream(
        self, request_id: str, tokens: np.ndarray, chunk: StreamChunk, speaker: CosyVoice2Speaker
    ) -> np.ndarray:
        target = torch.from_numpy(tokens[None, : chunk.token_end]).to(self.device, torch.int32)
        speech = self.token2wav.stream(
            request_id,
            target,
            speaker.prompt_tokens,
            speaker.prompt_feat,
            speaker.embedding,
            chunk.token_offset,
            chunk.finalize,
        )
        return self._audio(speech)


class DiTModel:
    def __init__(self, token2wav: DiTToken2Wav) -> None:
        self.token2wav = token2wav
        self.device = token2wav.device
        self.vocab_size = token2wav.vocab_size
        self.pre_lookahead_len = token2wav.pre_lookahead_len

    @classmethod
    def load(
        cls,
        folder: Path,
        device: torch.device,
        dtype: torch.dtype,
        seed: int,
        flow_graphs: FlowGraphConfig | None,
    ) -> DiTModel:
        # No speaker cache in the model: the benchmark keeps its own, so that every preparation is timed.
        t2w = DiTToken2Wav.from_model_dir(
            folder, device, dtype, seed=seed, speaker_cache_size=0, flow_graphs=flow_graphs
        )
        return cls(t2w)

    def prepare(self, wav_16k: np.ndarray) -> Any:
        return self.token2wav.prepare_speaker(wav_16k)

    def offline(self, tokens: np.ndarray, speaker: Any) -> np.ndarray:
        return self.token2wav.offline(tokens, speaker)

    def stream(self, request_id: str, tokens: np.ndarray, chunk: StreamChunk, speaker: Any) -> np.ndarray:
        piece = tokens[chunk.token_offset : chunk.token_end]
        return self.token2wav.stream(request_id, speaker, piece, chunk.finalize)


def load_model(
    model: str,
    model_dir: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    seed: int = 0,
    flow_graphs: FlowGraphConfig | None = None,
) -> Token2WavModel:
    folder = model_folder(model_dir, model)
    loader = CosyVoice2Model if model == "cosyvoice2" else DiTModel
    return loader.load(folder, device, dtype, seed, flow_graphs)
