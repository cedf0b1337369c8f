"""Stand-ins for CosyVoice2's two ONNX front-end models, `speech_tokenizer_v2.onnx` and `campplus.onnx`.

The real graphs (a 6-layer FSMN transformer with an FSQ codebook; the CAM++ speaker network) cannot be
reproduced from public code, so these are small random torch modules exported to ONNX with the same
inputs, outputs, dynamic axes, ranks and dtypes as upstream feeds and reads them:

- speech tokenizer: `feats` fp32 [B, 128, T] (whisper log-mel, 100 frames/s), `feats_length` int32 [B]
  → `indices` int32 [B, ceil(T / 4)] in [0, 6561): two stride-2 convolutions, then FSQ as in S3Tokenizer v2
  (project to 8 dims, tanh, round to {-1, 0, 1}, base-3 digits). Frames past `feats_length` are zeroed.
- CAM++: `input` fp32 [B, T, 80] (mean-normalized Kaldi fbank) → `output` fp32 [B, 192]: two convolutions
  and mean+std pooling over time.

Upstream reads inputs by position and takes output 0, so only `input` (named in upstream's TensorRT
profile) is a confirmed name; `feats`, `feats_length`, `indices` and `output` are assumed.
`full` is larger than `tiny` but neither costs what the real models do. The same preset and seed give the
same bytes.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.cosyvoice2.frontend import (
    CAMPPLUS_FILE,
    EMBEDDING_DIM,
    SPEAKER_MELS,
    SPEECH_TOKENIZER_FILE,
    TOKENIZER_MELS,
)
from tritontts.synthetic.presets import preset_entry

FSQ_DIGITS = 8
FSQ_LEVELS = 3
OPSET = 17


@dataclass(frozen=True)
class FrontendOnnxDims:
    tokenizer_hidden: int
    campplus_hidden: int


PRESETS = {
    "tiny": FrontendOnnxDims(tokenizer_hidden=16, campplus_hidden=16),
    "full": FrontendOnnxDims(tokenizer_hidden=256, campplus_hidden=512),
}


def _dims(preset: str) -> FrontendOnnxDims:
    return preset_entry(PRESETS, preset)


class SyntheticSpeechTokenizer(nn.Module):
    """Log-mel [B, 128, T] → FSQ ids [B, ceil(T / 4)], 25 tokens per second of 16 kHz audio."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(TOKENIZER_MELS, hidden, kernel_size=3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, kernel_size=3, stride=2, padding=1)
        self.project_down = nn.Linear(hidden, FSQ_DIGITS)
        self.register_buffer("powers", FSQ_LEVELS ** torch.arange(FSQ_DIGITS, dtype=torch.float32))

    def forward(self, feats: Tensor, feats_length: Tensor) -> Tensor:
        frames = torch.arange(feats.shape[-1], device=feats.device)
        valid = (frames[None, :] < feats_length[:, None].to(frames.dtype)).to(feats.dtype)
        x = F.gelu(self.conv1(feats * valid[:, None, :]))
        x = F.gelu(self.conv2(x))
        digits = (torch.tanh(self.project_down(x.transpose(1, 2))) * 0.999).round() + 1
        return (digits * self.powers).sum(dim=-1).to(torch.int32)


class SyntheticCampPlus(nn.Module):
    """Fbank [B, T, 80] → speaker embedding [B, 192]."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(SPEAKER_MELS, hidden, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(hidden, hidden, kernel_size=3, padding=1)
        self.dense = nn.Linear(2 * hidden, EMBEDDING_DIM)

    def forward(self, fbank: Tensor) -> Tensor:
        x = F.relu(self.conv1(fbank.transpose(1, 2)))
        x = F.relu(self.conv2(x))
        stats = torch.cat([x.mean(dim=-1), torch.sqrt(x.var(dim=-1, unbiased=False) + 1e-5)], dim=-1)
        return self.dense(stats)


def _seeded(module: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            fan_in = param[0].numel() if param.ndim > 1 else param.numel()
            param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)
    return module.eval()


def _export(
    module: nn.Module, args: tuple, path: Path, names: tuple[list[str], list[str]], axes: dict
) -> Path:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            args,
            buffer,
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buffer.getvalue())
    return path


def write_speech_tokenizer_onnx(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the synthetic `speech_tokenizer_v2.onnx` to `path` and return it."""
    model = _seeded(SyntheticSpeechTokenizer(_dims(preset).tokenizer_hidden), seed)
    feats = torch.zeros(1, TOKENIZER_MELS, 64)
    feats_length = torch.tensor([64], dtype=torch.int32)
    axes = {
        "feats": {0: "batch", 2: "frames"},
        "feats_length": {0: "batch"},
        "indices": {0: "batch", 1: "tokens"},
    }
    names = (["feats", "feats_length"], ["indices"])
    return _export(model, (feats, feats_length), Path(path), names, axes)


def write_campplus_onnx(path: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the synthetic `campplus.onnx` to `path` and return it."""
    model = _seeded(SyntheticCampPlus(_dims(preset).campplus_hidden), seed + 1)
    axes = {"input": {0: "batch", 1: "frames"}, "output": {0: "batch"}}
    return _export(model, (torch.zeros(1, 64, SPEAKER_MELS),), Path(path), (["input"], ["output"]), axes)


def write_frontend_onnx(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Both files into `model_dir` under their official names; returns `model_dir`."""
    model_dir = Path(model_dir)
    write_speech_tokenizer_onnx(model_dir / SPEECH_TOKENIZER_FILE, preset, seed)
    write_campplus_onnx(model_dir / CAMPPLUS_FILE, preset, seed)
    return model_dir
