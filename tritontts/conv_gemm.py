"""The flow estimators' convolutions as matrix multiplies over time-major memory, made once the weights are loaded.

cuDNN runs a half-precision 1-D convolution in NHWC: for activations stored [B, C, T] it converts the input (and
the weight) before every call; the profiles counted 646 `nchwToNhwcKernel` launches per streamed DiT chunk
(5.1 ms) and 626 per CosyVoice2 chunk (2.0 ms). After `pack_convs`, a kernel-3 causal convolution instead reads
its input time-major ([B, T + 2, C], frame t's window the contiguous rows t..t+2) and multiplies the windows by
the weight packed [O, 3C] once; a pointwise convolution is a Linear layer. The result is the [B, O, T] view of
time-major memory, which the LayerNorms and transformer blocks after it read without a transposing copy.

The modules keep the checkpoint's names and parameters (the packed weight is a buffer outside the state dict);
`unpack_convs` returns to cuDNN, for benchmarks that compare the two in one process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def windows_times(frames: Tensor, packed_weight: Tensor, bias: Tensor | None, kernel: int) -> Tensor:
    """frames [B, kernel - 1 + T, C] (history first) → [B, T, O]: each frame's `kernel` input rows, read as one
    row of kernel * C values, times `packed_weight` [O, kernel * C]."""
    frames = frames.contiguous()
    batch, length, channels = frames.shape
    windows = frames.as_strided(
        (batch, length - kernel + 1, kernel * channels), (frames.stride(0), channels, 1)
    )
    return F.linear(windows, packed_weight, bias)


class CausalConv1d(nn.Conv1d):
    """Stride-1 convolution padded on the left only, so frame t sees frames <= t; [B, C, T] → [B, O, T]."""

    packed_weight: Tensor | None

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size)
        self.causal_padding = kernel_size - 1
        self.register_buffer("packed_weight", None, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.packed_weight is None:
            return super().forward(F.pad(x, (self.causal_padding, 0)))
        return self.over_history(F.pad(x.mT, (0, 0, self.causal_padding, 0)).mT)

    def after_history(self, history: Tensor, x: Tensor) -> Tensor:
        """history [B, C, kernel - 1] ‖ x [B, C, T] on time, in the memory layout `over_history` reads (time-major
        when packed)."""
        if self.packed_weight is None:
            return torch.cat([history, x], dim=2)
        return torch.cat([history.mT, x.mT], dim=1).mT

    def over_history(self, y: Tensor) -> Tensor:
        """y [B, C, kernel - 1 + T]: its first kernel - 1 frames are the history → [B, O, T]."""
        if self.packed_weight is None:
            return F.conv1d(y, self.weight, self.bias)
        return windows_times(y.mT, self.packed_weight, self.bias, self.kernel_size[0]).mT

    def pack(self) -> None:
        self.packed_weight = self.weight.detach().permute(0, 2, 1).reshape(self.out_channels, -1).contiguous()


class PointwiseConv1d(nn.Conv1d):
    """Kernel-1 convolution [B, C, T] → [B, O, T]; packed, a Linear layer over the time-major view."""

    packed_weight: Tensor | None

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(in_channels, out_channels, 1)
        self.register_buffer("packed_weight", None, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.packed_weight is None:
            return super().forward(x)
        return F.linear(x.mT, self.packed_weight, self.bias).mT

    def pack(self) -> None:
        self.packed_weight = self.weight.detach()[:, :, 0].contiguous()


PACKABLE = (CausalConv1d, PointwiseConv1d)


def pack_convs(module: nn.Module) -> int:
    """Pack every causal and pointwise convolution of `module` (after its weights are loaded, in their final
    dtype); returns how many."""
    convs = [m for m in module.modules() if isinstance(m, PACKABLE)]
    for conv in convs:
        conv.pack()
    return len(convs)


def unpack_convs(module: nn.Module) -> int:
    """cuDNN's convolutions again (the path before packing); returns how many were packed."""
    convs = [m for m in module.modules() if isinstance(m, PACKABLE) and m.packed_weight is not None]
    for conv in convs:
        conv.packed_weight = None
    return len(convs)
