"""CosyVoice3's vocoder: upstream's `CausalHiFTGenerator` (+ `CausalConvRNNF0Predictor`), inference only.

CosyVoice2's HiFT with every convolution causal, a deterministic source (fixed noise, see `noise.py`; phase held
over each frame) and a `finalize` flag: a non-final call treats the last 3 mel frames as the f0 predictor's
look-ahead and the 4 before them as conv_pre's, and drops the last 480 samples, so its audio is a prefix of
what a final call over more mel gives. Parameter names are upstream's (weight norm as
`parametrizations.weight.original0/1`), for strict loading of `hift.pt`.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from tritontts.checkpoint import load_strict, read_state_dict
from tritontts.cosyvoice2.hift import (
    HIFT_FILE,
    ResBlock,
    fuse_weight_norm,
    official_key,
    source_spectrum,
    upsample_to_audio,
)
from tritontts.cosyvoice3.config import (
    CausalHiFTConfig,
    CosyVoice3Config,
    Flow3Config,
    load_cosyvoice3_config,
)
from tritontts.cosyvoice3.noise import UPSTREAM_NOISE_SAMPLES, source_noise
from tritontts.shape_graphs import ShapeGraphConfig, ShapeGraphs
from tritontts.spark.config import ConfigError

SOURCE_HARMONICS = 9  # upstream's causal sine generator hard-codes its noise width


def causal_padding(kernel_size: int, dilation: int = 1) -> int:
    """Upstream's CausalConv1d padding: (k - 1) * d for odd kernels, k - 1 for even ones (d = 1)."""
    return (kernel_size * dilation - dilation) // 2 * 2 + (kernel_size + 1) % 2


class CausalConv1d(nn.Conv1d):
    """Zero-padded on the left (`right=False`) or on the right by `causal_padding`; a right-padded one may be
    given the frames after its input as `context` instead of zeros."""

    def __init__(
        self, in_ch: int, out_ch: int, kernel_size: int, dilation: int = 1, right: bool = False
    ) -> None:
        super().__init__(in_ch, out_ch, kernel_size, dilation=dilation)
        self.causal_pad = causal_padding(kernel_size, dilation)
        self.right = right

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        if context is None:
            pad = (0, self.causal_pad) if self.right else (self.causal_pad, 0)
            return super().forward(F.pad(x, pad))
        if not self.right or context.size(2) != self.causal_pad:
            raise ValueError(f"context of {context.size(2)} frames for a conv padding {self.causal_pad}")
        return super().forward(torch.cat([x, context], dim=2))


class CausalUpsample(nn.Conv1d):
    """Nearest upsampling by `stride`, then a convolution left-padded by kernel - 1."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_ch, out_ch, kernel_size)
        self.stride_up = stride

    def forward(self, x: Tensor) -> Tensor:
        x = F.interpolate(x, scale_factor=float(self.stride_up), mode="nearest")
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalDownsample(nn.Conv1d):
    def __init__(self, in_ch: int, out_ch: int, kernel_size: int, stride: int) -> None:
        super().__init__(in_ch, out_ch, kernel_size, stride)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


def causal_conv(channels: int, kernel_size: int, dilation: int) -> nn.Module:
    """A left-padded convolution for CosyVoice2's ResBlock (upstream's CausalResBlock)."""
    return CausalConv1d(channels, channels, kernel_size, dilation)


class CausalF0Predictor(nn.Module):
    """A right-looking k4 convolution (3 frames of look-ahead), four left-padded k3 ones, ELU, a linear head."""

    def __init__(self, in_channels: int, cond_channels: int, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            weight_norm(CausalConv1d(in_channels, cond_channels, 4, right=True)),
            nn.ELU(),
        ]
        for _ in range(4):
            layers += [weight_norm(CausalConv1d(cond_channels, cond_channels, 3)), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    @property
    def lookahead(self) -> int:
        return self.condnet[0].causal_pad

    def forward(self, mel: Tensor, finalize: bool = True) -> Tensor:
        """mel [B, C, T] → |f0| [B, T] (finalize) or [B, T - lookahead] (the last frames only look ahead)."""
        first = self.condnet[0]
        if finalize:
            x = first(mel)
        else:
            x = first(mel[:, :, : -self.lookahead], context=mel[:, :, -self.lookahead :])
        for layer in self.condnet[1:]:
            x = layer(x)
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class CausalSource(nn.Module):
    """f0 per frame → the merged NSF excitation (upstream SineGen2(causal) + SourceModuleHnNSF) at inference."""

    def __init__(self, config: CausalHiFTConfig) -> None:
        super().__init__()
        self.config = config.hift
        self.l_linear = nn.Linear(config.hift.nb_harmonics + 1, 1)
        self.register_buffer("noise", torch.zeros(1, 0, SOURCE_HARMONICS), persistent=False)

    def forward(self, f0: Tensor) -> Tensor:
        """f0 [B, T] Hz → source [B, 1, T * samples_per_frame] float32."""
        cfg = self.config
        scale = cfg.samples_per_frame
        samples = f0.size(1) * scale
        if samples > self.noise.size(1):
            raise ValueError(
                f"{f0.size(1)} mel frames need {samples} noise samples, {self.noise.size(1)} loaded"
            )
        f0 = f0.float()
        voiced = (
            F.interpolate(f0[:, None], scale_factor=float(scale), mode="nearest") > cfg.nsf_voiced_threshold
        )
        voiced = voiced.float().transpose(1, 2)
        multiples = torch.arange(1, SOURCE_HARMONICS + 1, device=f0.device, dtype=torch.float32)
        increments = (f0[:, :, None] * multiples / cfg.sampling_rate) % 1
        phase = torch.cumsum(increments, dim=1) * 2 * math.pi
        phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=float(scale), mode="nearest")
        sines = torch.sin(phase).transpose(1, 2) * cfg.nsf_alpha
        noise_amp = voiced * cfg.nsf_sigma + (1 - voiced) * cfg.nsf_alpha / 3
        excitation = sines * voiced + noise_amp * self.noise[:, :samples].float()
        weight, bias = self.l_linear.weight.float(), self.l_linear.bias.float()
        return torch.tanh(F.linear(excitation, weight, bias)).transpose(1, 2)


class CausalHiFT(nn.Module):
    def __init__(self, config: CausalHiFTConfig) -> None:
        super().__init__()
        cfg = config.hift
        if cfg.nb_harmonics + 1 != SOURCE_HARMONICS:
            raise ConfigError(f"hift.nb_harmonics must be {SOURCE_HARMONICS - 1} (upstream's causal source)")
        self.config = config
        base, stages, spec = cfg.base_channels, len(cfg.upsample_rates), cfg.n_fft + 2
        self.m_source = CausalSource(config)
        self.conv_pre = weight_norm(
            CausalConv1d(cfg.in_channels, base, config.conv_pre_look_right + 1, right=True)
        )
        self.ups = nn.ModuleList(
            weight_norm(CausalUpsample(base >> i, base >> (i + 1), k, u))
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))
        )
        self.source_downs = nn.ModuleList()
        self.source_resblocks = nn.ModuleList()
        for i in range(stages):
            rate, channels = math.prod(cfg.upsample_rates[i + 1 :]), base >> (i + 1)
            down = (
                CausalConv1d(spec, channels, 1)
                if rate == 1
                else CausalDownsample(spec, channels, rate * 2, rate)
            )
            self.source_downs.append(down)
            self.source_resblocks.append(
                ResBlock(
                    channels,
                    cfg.source_resblock_kernel_sizes[i],
                    cfg.source_resblock_dilation_sizes[i],
                    causal_conv,
                )
            )
        self.resblocks = nn.ModuleList(
            ResBlock(base >> (i + 1), k, d, causal_conv)
            for i in range(stages)
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
        )
        self.conv_post = weight_norm(CausalConv1d(base >> stages, spec, 7))
        self.f0_predictor = CausalF0Predictor(cfg.f0_in_channels, cfg.f0_cond_channels, cfg.f0_num_class)
        self.register_buffer("stft_window", torch.hann_window(cfg.n_fft, periodic=True), persistent=False)
        self.graphs: ShapeGraphs | None = None

    def use_cuda_graphs(self, config: ShapeGraphConfig | None = None) -> None:
        """Replay whole calls (f0, source, decode: all deterministic) from CUDA graphs per mel length."""
        self.graphs = ShapeGraphs(self._infer, self.stft_window.device, config, "CausalHiFT")

    @property
    def lookahead_frames(self) -> int:
        """Mel frames a non-final call holds back: the f0 predictor's look-ahead plus conv_pre's."""
        return self.f0_predictor.lookahead + self.config.conv_pre_look_right

    def decode(self, mel: Tensor, source: Tensor, finalize: bool = True) -> Tensor:
        """mel [B, 80, T], source [B, 1, 480 T] → audio [B, 480 T] (finalize) or [B, 480 (T - 5)]."""
        cfg = self.config.hift
        source_spec = source_spectrum(source, cfg, self.stft_window)
        look = self.config.conv_pre_look_right
        if finalize:
            x = self.conv_pre(mel)
        else:
            x = self.conv_pre(mel[:, :, :-look], context=mel[:, :, -look:])
            source_spec = source_spec[:, :, : -math.prod(cfg.upsample_rates) * look]
        audio = upsample_to_audio(self, x, source_spec.to(mel.dtype))
        if not finalize:
            audio = audio[:, : -cfg.samples_per_frame]
        return audio.clamp(-cfg.audio_limit, cfg.audio_limit)

    def f0(self, mel: Tensor, finalize: bool = True) -> Tensor:
        """f0 [B, T or T - 3] computed in float64 as upstream (its causal inference is sensitive to it)."""
        if self.f0_predictor.classifier.weight.dtype != torch.float64:
            self.f0_predictor.double()
        return self.f0_predictor(mel.double(), finalize).to(mel.dtype)

    @torch.inference_mode()
    def inference(self, speech_feat: Tensor, finalize: bool = True) -> tuple[Tensor, Tensor]:
        """mel [B, 80, T] → (audio [B, 480 T] when finalize else [B, 480 (T - 8)], source float32)."""
        return (self.graphs or self._infer)(speech_feat, finalize=finalize)

    def _infer(self, speech_feat: Tensor, finalize: bool = True) -> tuple[Tensor, Tensor]:
        f0 = self.f0(speech_feat, finalize)
        source = self.m_source(f0)
        mel = speech_feat if finalize else speech_feat[:, :, : -self.f0_predictor.lookahead]
        return self.decode(mel, source, finalize), source

    def load_noise(self, flow: Flow3Config, max_seconds: float) -> None:
        samples = min(UPSTREAM_NOISE_SAMPLES, int(max_seconds * self.config.hift.sampling_rate))
        self.m_source.noise = source_noise(flow, self.config, samples).to(self.stft_window.device)


def load_causal_hift(
    path: str | Path,
    config: CosyVoice3Config | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    max_seconds: float = 300.0,
    fuse: bool = True,
) -> CausalHiFT:
    """Load `hift.pt` (a file, or the model directory) strictly; weight norm fused, the source noise of the
    first `max_seconds` of audio drawn (upstream keeps 300 s). `config` defaults to `cosyvoice3.yaml` beside it."""
    path = Path(path)
    weights = path / HIFT_FILE if path.is_dir() else path
    if config is None:
        config = load_cosyvoice3_config(weights.parent)
    state = {official_key(k): v for k, v in read_state_dict(weights).items()}
    model = CausalHiFT(config.hift)
    load_strict(model, state, source=str(weights))
    if fuse:
        for name, child in model.named_children():
            if name != "f0_predictor":
                fuse_weight_norm(child)
    model = model.to(device=device, dtype=dtype).eval()
    model.f0_predictor.double()  # as upstream: float32 g and v, the weight norm computed in float64
    if fuse:
        fuse_weight_norm(model.f0_predictor)
    model.load_noise(config.flow, max_seconds)
    return model
