"""CosyVoice2's prompt front end: speech tokens, prompt mel and speaker embedding of a 16 kHz reference.

As upstream computes them: tokens from `speech_tokenizer_v2.onnx` over whisper's 128-bin log-mel (100
frames/s → 25 tokens/s, at most 30 s of audio); the speaker embedding from `campplus.onnx` over a
mean-normalized 80-bin Kaldi fbank; the prompt mel (matcha, 80 bins, 50 frames/s) of the audio resampled
to 24 kHz; then tokens and mel cut to `n = min(mel_frames // 2, tokens)` and `2 n` frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tritontts.audio import AudioLimits, check_waveform
from tritontts.checkpoint import CheckpointError
from tritontts.dsp.hann_sinc_resample import hann_sinc_resample
from tritontts.dsp.kaldi_fbank import kaldi_fbank
from tritontts.dsp.matcha_mel import MatchaMelConfig, matcha_mel
from tritontts.dsp.whisper_mel import WHISPER_HOP, whisper_log_mel

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
CAMPPLUS_FILE = "campplus.onnx"
INPUT_SAMPLE_RATE = 16000
REFERENCE_FIELD = "reference_wav"
TOKENIZER_LIMITS = AudioLimits(max_seconds=30.0)
TOKENIZER_MELS = 128
TOKENS_PER_MEL_FRAME = 1 / 4
CODEBOOK_SIZE = 3**8
SPEAKER_MELS = 80
EMBEDDING_DIM = 192
PROMPT_MEL = MatchaMelConfig()
FEAT_FRAMES_PER_TOKEN = 2


def has_cuda_provider() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def onnx_device(device: str) -> str:
    """`auto` for onnxruntime: `cuda` where this onnxruntime has the CUDA provider, else `cpu`; any other name as
    given."""
    if device == "auto":
        return "cuda" if has_cuda_provider() else "cpu"
    return device


def create_session(path: str | Path, device: str = "cpu", threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime session on `device` ("cpu", "cuda", "cuda:N", or "auto": the GPU when this onnxruntime
    has the CUDA provider); the CUDA provider must exist for "cuda". `threads`: its intra-op threads on the CPU
    (upstream's frontend: 1)."""
    if threads < 1:
        raise ValueError(f"threads must be at least 1, got {threads}")
    path = Path(path)
    device = onnx_device(device)
    if not path.is_file():
        raise CheckpointError(f"ONNX model not found: {path}")
    if device == "cpu":
        providers: list = ["CPUExecutionProvider"]
    elif device.startswith("cuda"):
        if not has_cuda_provider():
            raise ValueError(
                f"device {device!r} asked for, but this onnxruntime has no CUDAExecutionProvider "
                f"(available: {', '.join(ort.get_available_providers())}); install onnxruntime-gpu"
            )
        device_id = int(device.partition(":")[2] or 0)
        providers = [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
    else:
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


def _check_input(spec: ort.NodeArg, array: np.ndarray, model: str) -> None:
    """Rank and fixed sizes of `array` against the session's input `spec`; symbolic sizes match anything."""
    expected = list(spec.shape)
    fits = len(expected) == array.ndim and all(
        not isinstance(size, int) or size == actual for size, actual in zip(expected, array.shape)
    )
    if not fits:
        raise ValueError(f"{model} input '{spec.name}' takes shape {expected}, got {list(array.shape)}")


def speech_token_count(num_samples_16k: int) -> int:
    """Tokens for a 16 kHz waveform: `ceil((num_samples // 160) / 4)` (mel frames at 100 Hz, tokens at 25 Hz)."""
    return math.ceil((num_samples_16k // WHISPER_HOP) * TOKENS_PER_MEL_FRAME)


class SpeechTokenizer:
    """`speech_tokenizer_v2.onnx` over whisper log-mel; ids in [0, 6561) as int32, with no vocabulary offset."""

    def __init__(self, onnx_path: str | Path, device: str = "cpu", threads: int = 1) -> None:
        self.session = create_session(onnx_path, device, threads)
        inputs = self.session.get_inputs()
        if len(inputs) != 2:
            raise CheckpointError(f"{onnx_path} has {len(inputs)} inputs; the speech tokenizer takes 2")
        self._feats, self._length = inputs

    def tokens_from_mel(self, mel: np.ndarray) -> np.ndarray:
        """Log-mel `[128, T]` → int32 ids `[ceil(T / 4)]`."""
        feats = np.asarray(mel, dtype=np.float32)
        if feats.ndim != 2 or feats.shape[0] != TOKENIZER_MELS:
            raise ValueError(
                f"speech tokenizer takes a log-mel [{TOKENIZER_MELS}, T], got {list(feats.shape)}"
            )
        feats = feats[None]
        _check_input(self._feats, feats, "speech tokenizer")
        length = np.array([feats.shape[-1]], dtype=np.int32)
        ids = self.session.run(None, {self._feats.name: feats, self._length.name: length})[0]
        if not np.issubdtype(ids.dtype, np.integer):
            raise CheckpointError(f"speech tokenizer returned {ids.dtype} ids; integers expected")
        return ids.reshape(-1).astype(np.int32)

    def __call__(self, wav_16k: np.ndarray, name: str = REFERENCE_FIELD) -> np.ndarray:
        """16 kHz mono float audio of at most 30 s → int32 ids `[speech_token_count(len)]`."""
        wav = check_waveform(wav_16k, INPUT_SAMPLE_RATE, TOKENIZER_LIMITS, name)
        return self.tokens_from_mel(whisper_log_mel(torch.from_numpy(wav), TOKENIZER_MELS).numpy())


def speaker_fbank(wav_16k: torch.Tensor) -> torch.Tensor:
    """CAMPPlus's input features: 80-bin Kaldi fbank `[frames, 80]` minus its mean over time."""
    feat = kaldi_fbank(wav_16k)
    return feat - feat.mean(dim=0, keepdim=True)


class SpeakerEmbedder:
    """`campplus.onnx`: mean-normalized fbank → fp32 speaker embedding `[192]`."""

    def __init__(self, onnx_path: str | Path, device: str = "cpu", threads: int = 1) -> None:
        self.session = create_session(onnx_path, device, threads)
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise CheckpointError(f"{onnx_path} has {len(inputs)} inputs; CAMPPlus takes 1")
        self._input = inputs[0]

    def embed_fbank(self, fbank: np.ndarray) -> np.ndarray:
        """Fbank `[T, 80]` → `[192]`."""
        feats = np.asarray(fbank, dtype=np.float32)
        if feats.ndim != 2 or feats.shape[1] != SPEAKER_MELS:
            raise ValueError(f"CAMPPlus takes an fbank [T, {SPEAKER_MELS}], got {list(feats.shape)}")
        feats = feats[None]
        _check_input(self._input, feats, "CAMPPlus")
        embedding = self.session.run(None, {self._input.name: feats})[0].reshape(-1)
        if embedding.shape != (EMBEDDING_DIM,):
            raise CheckpointError(f"CAMPPlus returned {embedding.size} values; {EMBEDDING_DIM} expected")
        return embedding.astype(np.float32)

    def __call__(self, wav_16k: np.ndarray, name: str = REFERENCE_FIELD) -> np.ndarray:
        wav = check_waveform(wav_16k, INPUT_SAMPLE_RATE, name=name)
        return self.embed_fbank(speaker_fbank(torch.from_numpy(wav)).numpy())


def prompt_speech_feat(
    wav_24k: np.ndarray | torch.Tensor, config: MatchaMelConfig = PROMPT_MEL
) -> np.ndarray:
    """24 kHz mono audio `[L]` → fp32 prompt mel `[L // 480, 80]` (time first, as the flow takes it);
    `config` is the model's `feat_extractor` (CosyVoice3's has fmax 12 kHz)."""
    wav = torch.as_tensor(wav_24k, dtype=torch.float32)
    if wav.ndim != 1:
        raise ValueError(f"prompt_speech_feat takes one mono waveform [L], got shape {tuple(wav.shape)}")
    return matcha_mel(wav, config).T.contiguous().numpy()


def align_prompt_lengths(tokens: np.ndarray, feat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cut to `n = min(len(feat) // 2, len(tokens))` tokens and `2 n` mel frames, as upstream does."""
    n = min(len(feat) // FEAT_FRAMES_PER_TOKEN, len(tokens))
    return tokens[:n], feat[: FEAT_FRAMES_PER_TOKEN * n]


@dataclass(frozen=True)
class PromptFeatures:
    speech_tokens: np.ndarray
    """int32 `[n]`, ids in [0, 6561)"""
    speech_feat: np.ndarray
    """fp32 `[2 n, 80]`"""
    spk_embedding: np.ndarray
    """fp32 `[192]`"""


class CosyVoice2Frontend:
    """A 16 kHz reference waveform → aligned prompt tokens, prompt mel and speaker embedding.

    Each ONNX session is created once, here; upstream runs CAMPPlus on CPU and the tokenizer on the GPU.
    """

    def __init__(
        self, tokenizer: SpeechTokenizer, speaker: SpeakerEmbedder, prompt_mel: MatchaMelConfig = PROMPT_MEL
    ) -> None:
        self.tokenizer = tokenizer
        self.speaker = speaker
        self.prompt_mel = prompt_mel

    @classmethod
    def from_model_dir(
        cls, model_dir: str | Path, tokenizer_device: str = "cpu", speaker_device: str = "cpu"
    ) -> CosyVoice2Frontend:
        """From `speech_tokenizer_v2.onnx` and `campplus.onnx` in a CosyVoice2 model directory."""
        model_dir = Path(model_dir)
        return cls(
            SpeechTokenizer(model_dir / SPEECH_TOKENIZER_FILE, tokenizer_device),
            SpeakerEmbedder(model_dir / CAMPPLUS_FILE, speaker_device),
        )

    def __call__(self, wav_16k: np.ndarray, name: str = REFERENCE_FIELD) -> PromptFeatures:
        wav = check_waveform(wav_16k, INPUT_SAMPLE_RATE, TOKENIZER_LIMITS, name)
        samples = torch.from_numpy(wav)
        tokens = self.tokenizer.tokens_from_mel(whisper_log_mel(samples, TOKENIZER_MELS).numpy())
        wav_24k = hann_sinc_resample(samples, INPUT_SAMPLE_RATE, self.prompt_mel.sampling_rate)
        feat = prompt_speech_feat(wav_24k, self.prompt_mel)
        tokens, feat = align_prompt_lengths(tokens, feat)
        embedding = self.speaker.embed_fbank(speaker_fbank(samples).numpy())
        return PromptFeatures(speech_tokens=tokens, speech_feat=feat, spk_embedding=embedding)
