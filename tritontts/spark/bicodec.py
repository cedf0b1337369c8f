"""BiCodec: wav2vec2 features + reference audio → (global, semantic) tokens → 16 kHz audio.

The module tree, parameter names and buffers match upstream `sparktts.models.bicodec.BiCodec`, so the
official `BiCodec/model.safetensors` loads strictly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from tritontts.checkpoint import load_strict, read_state_dict
from tritontts.dsp.mel import MelSpectrogram
from tritontts.spark.config import BiCodecConfig
from tritontts.spark.frame_mask import FrameMask, temporal_convs
from tritontts.spark.layers import fuse_weight_norm
from tritontts.spark.quantizers import FactorizedVectorQuantizer
from tritontts.spark.speaker import SpeakerEncoder
from tritontts.spark.vocos import FeatureDecoder, FeatureEncoder
from tritontts.spark.wave_generator import WaveGenerator


def _checked_lengths(lengths: Tensor, batch: int, full: int) -> list[int]:
    values = [int(v) for v in lengths.tolist()]
    if len(values) != batch or any(not 0 <= v <= full for v in values):
        raise ValueError(f"lengths must be {batch} values in 0..{full}, got {values}")
    return values


def _groups_by_length(lengths: Tensor | None, batch: int, full: int) -> dict[int, list[int]]:
    """Item indices grouped by valid length (all `full` when `lengths` is None); empty items are left out."""
    if lengths is None:
        return {full: list(range(batch))} if full > 0 else {}
    values = _checked_lengths(lengths, batch, full)
    groups: dict[int, list[int]] = {}
    for index, value in enumerate(values):
        if value > 0:
            groups.setdefault(value, []).append(index)
    return groups


class BiCodec(nn.Module):
    """Every item of a padded batch is computed as it would be alone; outputs past an item's length are zero.
    `tokenize` runs the batch in one pass, the encoder's convolutions seeing zeros past each item's end
    (`FrameMask`); `detokenize` splits it into groups of equal length (the vocoder's padded passes are
    `tritontts.spark.padded_detokenize`)."""

    def __init__(self, cfg: BiCodecConfig) -> None:
        super().__init__()
        self.config = cfg
        self.hop_length = cfg.decoder.hop_length
        self.encoder = FeatureEncoder(cfg.encoder)
        self.encoder_mask = FrameMask(temporal_convs(self.encoder))
        self.decoder = WaveGenerator(cfg.decoder)
        self.quantizer = FactorizedVectorQuantizer(cfg.quantizer)
        self.speaker_encoder = SpeakerEncoder(cfg.speaker_encoder)
        self.prenet = FeatureDecoder(cfg.prenet)
        self.postnet = FeatureDecoder(cfg.postnet)
        mel = cfg.mel_params
        self.mel_transformer = MelSpectrogram(
            mel.sample_rate,
            mel.n_fft,
            mel.win_length,
            mel.hop_length,
            mel.mel_fmin,
            mel.mel_fmax,
            n_mels=mel.num_mels,
            power=1.0,
            norm="slaney",
            mel_scale="slaney",
        )

    @property
    def dtype(self) -> torch.dtype:
        return self.quantizer.codebook.weight.dtype

    @torch.no_grad()
    def tokenize_global(self, ref_wavs: Tensor) -> Tensor:
        """Reference clips `[B, ref_len]` → global ids `[B, token_num]` (`[B, Q, token_num]` if Q > 1)."""
        mel = self.mel_transformer(ref_wavs).to(self.dtype)
        ids = self.speaker_encoder.tokenize(mel)
        return ids[:, 0] if ids.shape[1] == 1 else ids

    @torch.no_grad()
    def tokenize_semantic(self, features: Tensor, lengths: Tensor | None = None) -> Tensor:
        """wav2vec2 features `[B, T, C_in]` → semantic ids `[B, T]` (0 past each item's length)."""
        batch, frames, _ = features.shape
        if lengths is None:
            lengths = torch.full((batch,), frames, dtype=torch.long)
        _checked_lengths(lengths, batch, frames)
        lengths = lengths.to(features.device)
        with self.encoder_mask.active(lengths, frames):
            ids = self.quantizer.tokenize(self.encoder(features.to(self.dtype).transpose(1, 2)))
        return ids.masked_fill(torch.arange(frames, device=ids.device) >= lengths.unsqueeze(1), 0)

    @torch.no_grad()
    def tokenize(
        self, features: Tensor, ref_wavs: Tensor, lengths: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """→ (global ids `[B, token_num]`, semantic ids `[B, T]`); `lengths` are valid frames per item."""
        return self.tokenize_global(ref_wavs), self.tokenize_semantic(features, lengths)

    @torch.no_grad()
    def speaker_vector(self, global_tokens: Tensor) -> Tensor:
        ids = global_tokens.unsqueeze(1) if global_tokens.dim() == 2 else global_tokens
        return self.speaker_encoder.detokenize(ids)

    @torch.no_grad()
    def detokenize(
        self, global_tokens: Tensor, semantic_tokens: Tensor, lengths: Tensor | None = None
    ) -> Tensor:
        """(global ids `[B, token_num]`, semantic ids `[B, T]`) → audio `[B, T * hop]` (0 past a length)."""
        batch, frames = semantic_tokens.shape
        speaker = self.speaker_vector(global_tokens)
        audio = torch.zeros(batch, frames * self.hop_length, dtype=speaker.dtype, device=speaker.device)
        for length, items in _groups_by_length(lengths, batch, frames).items():
            latents = self.quantizer.detokenize(semantic_tokens[items, :length])
            x = self.prenet(latents, speaker[items]) + speaker[items].unsqueeze(-1)
            audio[items, : length * self.hop_length] = self.decoder(x)[:, 0]
        return audio


def load_bicodec(
    bicodec_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> BiCodec:
    """Build from `bicodec_dir/config.yaml`, load `model.safetensors` strictly, fold weight norm, eval."""
    bicodec_dir = Path(bicodec_dir)
    model = BiCodec(BiCodecConfig.from_yaml(bicodec_dir / "config.yaml"))
    load_strict(model, read_state_dict(bicodec_dir / "model.safetensors"), source=str(bicodec_dir))
    fuse_weight_norm(model)
    return model.eval().to(device=device, dtype=dtype)
