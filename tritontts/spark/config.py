"""Configs of BiCodec (`BiCodec/config.yaml`) and of the audio front end (top-level `config.yaml`)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file lacks a value the model needs, or holds one it cannot take."""


def _build(cls, values: dict[str, Any], section: str, lenient: bool = False):
    """`cls(**values)`; unknown keys are an error unless `lenient` (upstream takes `**kwargs` there)."""
    if not isinstance(values, dict):
        raise ConfigError(f"{section}: expected a mapping, found {type(values).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown and not lenient:
        raise ConfigError(f"{section}: unknown keys {unknown}")
    required = [
        name
        for name, f in known.items()
        if f.default is MISSING and f.default_factory is MISSING and name not in values
    ]
    if required:
        raise ConfigError(f"{section}: missing keys {required}")
    return cls(**{k: v for k, v in values.items() if k in known})


@dataclass
class MelParams:
    sample_rate: int
    n_fft: int
    win_length: int
    hop_length: int
    mel_fmin: float
    mel_fmax: float | None
    num_mels: int


@dataclass
class VocosConfig:
    """The feature encoder (no condition) or a feature decoder (prenet with condition, postnet without)."""

    input_channels: int
    vocos_dim: int
    vocos_intermediate_dim: int
    vocos_num_layers: int
    out_channels: int
    sample_ratios: list[int] = field(default_factory=lambda: [1, 1])
    condition_dim: int | None = None
    use_tanh_at_final: bool = False


@dataclass
class QuantizerConfig:
    """Factorized VQ; training-only keys (commitment, codebook_loss_weight, decay, ...) are ignored."""

    input_dim: int
    codebook_size: int
    codebook_dim: int
    use_l2_normlize: bool = True


@dataclass
class SpeakerEncoderConfig:
    input_dim: int = 100
    out_dim: int = 512
    latent_dim: int = 128
    token_num: int = 32
    fsq_levels: list[int] = field(default_factory=lambda: [4, 4, 4, 4, 4, 4])
    fsq_num_quantizers: int = 1


@dataclass
class WaveGeneratorConfig:
    input_channel: int
    channels: int
    rates: list[int]
    kernel_sizes: list[int]
    d_out: int = 1

    @property
    def hop_length(self) -> int:
        hop = 1
        for rate in self.rates:
            hop *= rate
        return hop


@dataclass
class BiCodecConfig:
    mel_params: MelParams
    encoder: VocosConfig
    quantizer: QuantizerConfig
    speaker_encoder: SpeakerEncoderConfig
    prenet: VocosConfig
    postnet: VocosConfig
    decoder: WaveGeneratorConfig

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BiCodecConfig:
        """From the mapping under `audio_tokenizer:` (or a mapping that holds that key)."""
        raw = raw.get("audio_tokenizer", raw)
        sections = ("mel_params", "encoder", "quantizer", "speaker_encoder", "prenet", "postnet", "decoder")
        missing = [name for name in sections if name not in raw]
        if missing:
            raise ConfigError(f"audio_tokenizer: missing sections {missing}")
        if {"condition_dim", "use_tanh_at_final"} & set(raw["encoder"]):
            raise ConfigError("encoder: takes no condition_dim / use_tanh_at_final")
        config = cls(
            mel_params=_build(MelParams, raw["mel_params"], "mel_params", lenient=True),
            encoder=_build(VocosConfig, raw["encoder"], "encoder"),
            quantizer=_build(QuantizerConfig, raw["quantizer"], "quantizer", lenient=True),
            speaker_encoder=_build(SpeakerEncoderConfig, raw["speaker_encoder"], "speaker_encoder"),
            prenet=_build(VocosConfig, raw["prenet"], "prenet"),
            postnet=_build(VocosConfig, raw["postnet"], "postnet"),
            decoder=_build(WaveGeneratorConfig, raw["decoder"], "decoder"),
        )
        config.validate()
        return config

    @classmethod
    def from_yaml(cls, path: str | Path) -> BiCodecConfig:
        with open(path) as f:
            return cls.from_dict(yaml.safe_load(f))

    def validate(self) -> None:
        if self.speaker_encoder.input_dim != self.mel_params.num_mels:
            raise ConfigError(
                f"speaker_encoder.input_dim {self.speaker_encoder.input_dim} != "
                f"mel_params.num_mels {self.mel_params.num_mels}"
            )
        if self.decoder.hop_length != self.mel_params.hop_length:
            raise ConfigError(
                f"decoder rates multiply to {self.decoder.hop_length}, mel hop_length is "
                f"{self.mel_params.hop_length}"
            )
        for name in ("encoder", "prenet", "postnet"):
            if any(r != 1 for r in getattr(self, name).sample_ratios):
                raise ConfigError(f"{name}.sample_ratios other than 1 are not supported")
        if self.prenet.condition_dim is None or self.prenet.condition_dim != self.speaker_encoder.out_dim:
            raise ConfigError("prenet.condition_dim must equal speaker_encoder.out_dim")


@dataclass
class SparkAudioConfig:
    """The top-level `config.yaml` of a Spark-TTS checkpoint."""

    sample_rate: int
    ref_segment_duration: float
    latent_hop_length: int
    volume_normalize: bool = True
    highpass_cutoff_freq: float = 40
    segment_duration: float = 2.4
    max_val_duration: float = 12

    @property
    def ref_segment_length(self) -> int:
        return (
            int(self.sample_rate * self.ref_segment_duration)
            // self.latent_hop_length
            * self.latent_hop_length
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> SparkAudioConfig:
        with open(path) as f:
            raw = yaml.safe_load(f) or {}
        return _build(cls, raw, str(path), lenient=True)
