"""CosyVoice2's HiFT vocoder: an NSF harmonic source fused into a HiFi-GAN upsampler with an iSTFT head.

mel `[B, 80, T]` → f0 per frame → a sine-plus-noise source at 24 kHz → its STFT, downsampled into each
upsampling stage → magnitude/phase of a 16-point STFT → audio `[B, 480 T]`.

The parameter names are upstream's `HiFTGenerator` built with `torch.nn.utils.parametrizations.weight_norm`
(torch >= 2.1, which upstream's requirements pin): every weight-normed convolution holds
`<name>.parametrizations.weight.original0` (the gain g, `[out, 1, 1]`; `[in, 1, 1]` for the transposed
convolutions) and `<name>.parametrizations.weight.original1` (the direction v). That is what the hub's
`hift.pt` holds: upstream loads it strictly into such a module. `load_hift` also takes the pre-2.1 names
`<name>.weight_g` / `<name>.weight_v` of the same tensors, and strips a `generator.` prefix (a whole
HiFi-GAN training checkpoint) as upstream does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize
from torch.nn.utils.parametrizations import weight_norm

from tritontts.checkpoint import load_strict, read_state_dict
from tritontts.cosyvoice2.f0_predictor import ConvRNNF0Predictor
from tritontts.dsp.istft import istft
from tritontts.shape_graphs import ShapeGraphConfig, ShapeGraphs
from tritontts.spark.config import ConfigError

HIFT_FILE = "hift.pt"
MAGNITUDE_LIMIT = 1e2


@dataclass(frozen=True)
class HiFTConfig:
    """Defaults are the values of the reference `cosyvoice2.yaml`."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    n_fft: int = 16
    hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_in_channels: int = 80
    f0_cond_channels: int = 512
    f0_num_class: int = 1

    def __post_init__(self) -> None:
        if self.sampling_rate == 22050:
            raise ConfigError(
                "sampling_rate 22050 selects CosyVoice 1's sine generator, not implemented here"
            )
        stages = len(self.upsample_rates)
        if len(self.upsample_kernel_sizes) != stages or len(self.source_resblock_kernel_sizes) != stages:
            raise ConfigError(
                "upsample_rates, upsample_kernel_sizes, source_resblock_kernel_sizes differ in length"
            )
        if self.f0_num_class != 1:
            raise ConfigError(f"f0_predictor.num_class must be 1, found {self.f0_num_class}")

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per mel frame: 8 * 5 * 3 * 4 = 480 (20 ms at 24 kHz)."""
        return math.prod(self.upsample_rates) * self.hop_len

    @classmethod
    def from_yaml_dict(cls, section: dict[str, Any]) -> HiFTConfig:
        """The `hift:` section of cosyvoice2.yaml as plain data (`istft_params`, `f0_predictor` nested)."""
        if not isinstance(section, dict):
            raise ConfigError(f"hift: expected a mapping, found {type(section).__name__}")
        values = dict(section)
        istft = values.pop("istft_params", None)
        f0 = values.pop("f0_predictor", None)
        if not isinstance(istft, dict) or not isinstance(f0, dict):
            raise ConfigError("hift: needs the mappings istft_params and f0_predictor")
        values.update(
            n_fft=istft.get("n_fft"),
            hop_len=istft.get("hop_len"),
            f0_in_channels=f0.get("in_channels"),
            f0_cond_channels=f0.get("cond_channels"),
            f0_num_class=f0.get("num_class"),
        )
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        missing = sorted(k for k in names if values.get(k) is None)
        if unknown:
            raise ConfigError(f"hift: unknown keys {unknown}")
        if missing:
            raise ConfigError(f"hift: missing keys {missing}")
        for key in (
            "upsample_rates",
            "upsample_kernel_sizes",
            "resblock_kernel_sizes",
            "source_resblock_kernel_sizes",
        ):
            values[key] = tuple(int(v) for v in values[key])
        for key in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
            values[key] = tuple(tuple(int(d) for d in ds) for ds in values[key])
        return cls(**values)


class Snake(nn.Module):
    """`x + sin(alpha x)^2 / alpha`, alpha per channel `[C]`."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


ConvMaker = Callable[[int, int, int], nn.Module]
"""(channels, kernel_size, dilation) → a channels-to-channels convolution keeping the length."""


def same_padded_conv(channels: int, kernel_size: int, dilation: int) -> nn.Module:
    padding = (kernel_size * dilation - dilation) // 2
    return nn.Conv1d(channels, channels, kernel_size, dilation=dilation, padding=padding)


class ResBlock(nn.Module):
    """Three (Snake, dilated conv, Snake, conv) residual units; 'same' padding unless `conv` says otherwise
    (CosyVoice3's causal HiFT gives left-padded convolutions)."""

    def __init__(
        self, channels: int, kernel_size: int, dilations: tuple[int, ...], conv: ConvMaker = same_padded_conv
    ) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(weight_norm(conv(channels, kernel_size, d)) for d in dilations)
        self.convs2 = nn.ModuleList(weight_norm(conv(channels, kernel_size, 1)) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for conv1, conv2, act1, act2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + conv2(act2(conv1(act1(x))))
        return x


class HarmonicSource(nn.Module):
    """f0 per frame → the merged NSF excitation at the sample rate (upstream SineGen2 + SourceModuleHnNSF).

    Random draws, in upstream's order: an initial phase per harmonic `[B, H]`, then Gaussian noise `[B, L, H]`
    filled in place over a `[B, H, L]` memory layout (upstream's `randn_like` of a transposed tensor; torch
    fills such a tensor with other numbers than a contiguous one). Upstream adds the initial phase to the first sample only, which its linear 480x
    downsampling of the phase increments never reads, so it changes nothing; it is drawn anyway so that a
    generator seeded like upstream's global RNG gives upstream's noise.
    """

    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.config = config
        self.l_linear = nn.Linear(config.nb_harmonics + 1, 1)

    def forward(self, f0: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """f0 `[B, T]` in Hz → source `[B, 1, T * samples_per_frame]`, float32."""
        cfg = self.config
        scale = cfg.samples_per_frame
        batch, frames = f0.shape
        harmonics = cfg.nb_harmonics + 1
        device = f0.device
        draw_device = generator.device if generator is not None else device
        torch.rand(batch, harmonics, generator=generator, device=draw_device)
        noise = torch.empty(batch, harmonics, frames * scale, device=draw_device).transpose(1, 2)
        noise = noise.normal_(generator=generator).to(device)

        f0_samples = F.interpolate(f0.float()[:, None], scale_factor=float(scale), mode="nearest")
        voiced = (f0_samples > cfg.nsf_voiced_threshold).float().transpose(1, 2)
        # Phase increment per sample (cycles), taken once per frame: what upstream's linear downsampling reads.
        multiples = torch.arange(1, harmonics + 1, device=device, dtype=torch.float32)
        increments = (f0.float()[:, :, None] * multiples / cfg.sampling_rate) % 1
        phase = torch.cumsum(increments, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=float(scale), mode="linear")
        sines = torch.sin(phase).transpose(1, 2) * cfg.nsf_alpha

        noise_amp = voiced * cfg.nsf_sigma + (1 - voiced) * cfg.nsf_alpha / 3
        excitation = sines * voiced + noise_amp * noise
        weight, bias = self.l_linear.weight.float(), self.l_linear.bias.float()
        return torch.tanh(F.linear(excitation, weight, bias)).transpose(1, 2)


class HiFT(nn.Module):
    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.config = config
        base = config.base_channels
        stages = len(config.upsample_rates)
        spec_channels = config.n_fft + 2
        self.m_source = HarmonicSource(config)
        self.conv_pre = weight_norm(nn.Conv1d(config.in_channels, base, 7, 1, padding=3))
        self.ups = nn.ModuleList(
            weight_norm(nn.ConvTranspose1d(base >> i, base >> (i + 1), k, u, padding=(k - u) // 2))
            for i, (u, k) in enumerate(zip(config.upsample_rates, config.upsample_kernel_sizes))
        )
        # Stage i sees the source STFT downsampled by the product of the later upsampling rates.
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i in range(stages):
            rate = math.prod(config.upsample_rates[i + 1 :])
            channels = base >> (i + 1)
            if rate == 1:
                self.source_downs.append(nn.Conv1d(spec_channels, channels, 1, 1))
            else:
                self.source_downs.append(
                    nn.Conv1d(spec_channels, channels, rate * 2, rate, padding=rate // 2)
                )
            self.source_resblocks.append(
                ResBlock(
                    channels, config.source_resblock_kernel_sizes[i], config.source_resblock_dilation_sizes[i]
                )
            )
        self.resblocks = nn.ModuleList(
            ResBlock(base >> (i + 1), k, d)
            for i in range(stages)
            for k, d in zip(config.resblock_kernel_sizes, config.resblock_dilation_sizes)
        )
        self.conv_post = weight_norm(nn.Conv1d(base >> stages, spec_channels, 7, 1, padding=3))
        self.f0_predictor = ConvRNNF0Predictor(
            config.f0_in_channels, config.f0_cond_channels, config.f0_num_class
        )
        self.register_buffer("stft_window", torch.hann_window(config.n_fft, periodic=True), persistent=False)
        self.f0_graphs: ShapeGraphs | None = None
        self.decode_graphs: ShapeGraphs | None = None

    def use_cuda_graphs(self, config: ShapeGraphConfig | None = None) -> None:
        """Replay the f0 predictor and the decoder from CUDA graphs per mel length (the source's random draws
        stay eager, so a stream's generator is honoured)."""
        device = self.stft_window.device
        self.f0_graphs = ShapeGraphs(self.f0_predictor, device, config, "HiFT f0")
        self.decode_graphs = ShapeGraphs(self.decode, device, config, "HiFT decode")

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel `[B, 80, T]` and source `[B, 1, 480 T]` → audio `[B, 480 T]` in [-audio_limit, audio_limit]."""
        cfg = self.config
        source_spec = source_spectrum(source, cfg, self.stft_window).to(mel.dtype)
        audio = upsample_to_audio(self, self.conv_pre(mel), source_spec)
        return audio.clamp(-cfg.audio_limit, cfg.audio_limit)

    @torch.inference_mode()
    def inference(
        self,
        speech_feat: Tensor,
        cache_source: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """mel `[B, 80, T]` → (audio `[B, 480 T]`, source `[B, 1, 480 T]` float32).

        `cache_source` `[B, 1, S]` replaces the first S source samples (streaming: the previous chunk's
        source over the overlapping mel frames, so the excitation has no jump there). The noise comes from
        `generator` (or torch's global RNG, as upstream, which never seeds it per request).
        """
        f0 = (self.f0_graphs or self.f0_predictor)(speech_feat)
        source = self.m_source(f0, generator)
        if cache_source is not None and cache_source.shape[-1] > 0:
            cached = cache_source.shape[-1]
            if cached > source.shape[-1]:
                raise ValueError(
                    f"cache_source has {cached} samples, more than the {source.shape[-1]} of the mel"
                )
            source[:, :, :cached] = cache_source.to(source)
        return (self.decode_graphs or self.decode)(speech_feat, source), source


def source_spectrum(source: Tensor, config: HiFTConfig, window: Tensor) -> Tensor:
    """The source `[B, 1, S]`'s STFT as real and imaginary channels `[B, n_fft + 2, frames]`, float32."""
    spec = torch.stft(
        source.squeeze(1).float(),
        config.n_fft,
        config.hop_len,
        config.n_fft,
        window.float(),
        return_complex=True,
    )
    return torch.cat([spec.real, spec.imag], dim=1)


def upsample_to_audio(model: nn.Module, x: Tensor, source_spec: Tensor) -> Tensor:
    """A HiFT's body after conv_pre (`x`), CosyVoice2's and CosyVoice3's alike: each upsampling stage plus its
    downsampled source, the averaged resblocks, conv_post → magnitude and phase → iSTFT audio (not clamped).

    `model` has `config` (a HiFTConfig, or one under `.hift`), `ups`, `source_downs`, `source_resblocks`,
    `resblocks`, `conv_post` and `stft_window`."""
    cfg: HiFTConfig = getattr(model.config, "hift", model.config)
    bins, window = cfg.n_fft // 2 + 1, model.stft_window.float()
    kernels, last = len(cfg.resblock_kernel_sizes), len(model.ups) - 1
    for i, up in enumerate(model.ups):
        x = up(F.leaky_relu(x, cfg.lrelu_slope))
        if i == last:
            x = F.pad(x, (1, 0), mode="reflect")
        x = x + model.source_resblocks[i](model.source_downs[i](source_spec))
        x = sum(model.resblocks[i * kernels + j](x) for j in range(kernels)) / kernels
    x = model.conv_post(F.leaky_relu(x)).float()
    magnitude = torch.exp(x[:, :bins]).clip(max=MAGNITUDE_LIMIT)
    phase = torch.sin(x[:, bins:])
    spectrum = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
    return istft(spectrum, cfg.n_fft, cfg.hop_len, window)


def fuse_weight_norm(module: nn.Module) -> None:
    """Replace each weight-norm parametrization by its weight (inference only; state_dict keys change)."""
    for child in module.modules():
        if parametrize.is_parametrized(child, "weight"):
            parametrize.remove_parametrizations(child, "weight", leave_parametrized=True)


def official_key(key: str) -> str:
    """A hift.pt key as our module names it: no `generator.` prefix, pre-2.1 weight-norm names renamed."""
    key = key.removeprefix("generator.")
    if key.endswith(".weight_g"):
        return key[: -len("weight_g")] + "parametrizations.weight.original0"
    if key.endswith(".weight_v"):
        return key[: -len("weight_v")] + "parametrizations.weight.original1"
    return key


def load_hift(
    path: str | Path,
    config: HiFTConfig,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    fuse: bool = True,
) -> HiFT:
    """Load `hift.pt` (a file, or a model directory holding one) strictly; eval mode, weight norm fused."""
    path = Path(path)
    if path.is_dir():
        path = path / HIFT_FILE
    state = {official_key(k): v for k, v in read_state_dict(path).items()}
    model = HiFT(config)
    load_strict(model, state, source=str(path))
    if fuse:
        fuse_weight_norm(model)
    return model.to(device=device, dtype=dtype).eval()
