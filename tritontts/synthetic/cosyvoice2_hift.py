"""A random-weight CosyVoice2 `hift.pt`: the official keys and shapes (`full`) or a CPU-test size (`tiny`).

The file is what the hub ships: `torch.save` of a plain fp32 state_dict, weight norm stored as
`parametrizations.weight.original0/1`, no `generator.` prefix.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tritontts.cosyvoice2.hift import HIFT_FILE, HiFT, HiFTConfig
from tritontts.synthetic.presets import preset_entry

PRESETS: dict[str, HiFTConfig] = {
    "full": HiFTConfig(),
    "tiny": HiFTConfig(base_channels=32, f0_cond_channels=32),
}
F0_MEAN_HZ = 150.0
F0_SPREAD_HZ = 60.0
CONV_POST_GAIN = 0.1  # keeps exp(magnitude) small: speech-like levels instead of audio pinned at the limit


def preset_config(preset: str) -> HiFTConfig:
    return preset_entry(PRESETS, preset)


def meta_state_dict(preset: str = "full") -> dict[str, torch.Tensor]:
    """The module's state_dict on the meta device (shapes only, nothing allocated)."""
    with torch.device("meta"):
        return HiFT(preset_config(preset)).state_dict()


def hift_tensor(
    name: str, shape: torch.Size, gen: torch.Generator, transposed_ups: bool = True
) -> torch.Tensor:
    """One seeded HiFT tensor: unit Snake alphas, zero biases (the f0 head's at a speaking pitch), weights with
    variance 1/fan_in (`transposed_ups`: the `ups.` convolutions are transposed, fan_in = in * kernel)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "alpha":
        return torch.ones(shape)
    if name == "f0_predictor.classifier.bias":
        return torch.full(shape, F0_MEAN_HZ)
    if leaf == "bias":
        return torch.zeros(shape)
    transposed = transposed_ups and name.startswith("ups.")
    fan_in = shape[0] * shape[2] if transposed else math.prod(shape[1:])
    std = 1.0 / math.sqrt(fan_in)
    if name == "f0_predictor.classifier.weight":
        std *= F0_SPREAD_HZ
    if name.startswith("conv_post."):
        std *= CONV_POST_GAIN
    return torch.randn(shape, generator=gen) * std


def set_weight_norm_gains(state: dict[str, torch.Tensor]) -> None:
    """Each weight-norm gain (`...original0`) := the norm of its direction (`...original1`): weight = direction."""
    for name in state:
        if name.endswith("original0"):
            direction = state[name[: -len("0")] + "1"]
            state[name] = direction.pow(2).sum(dim=(1, 2), keepdim=True).sqrt()


def random_state_dict(preset: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights; each weight-norm gain is the norm of its direction (so weight = direction)."""
    shapes = meta_state_dict(preset)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name in sorted(shapes):  # the gains' places hold their meta tensors until set from the directions
        gain = name.endswith("original0")
        state[name] = shapes[name] if gain else hift_tensor(name, shapes[name].shape, gen)
    set_weight_norm_gains(state)
    return {name: state[name].contiguous() for name in shapes}


def write_hift(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write `hift.pt` under `model_dir`; the same preset and seed give the same bytes."""
    path = Path(model_dir) / HIFT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(random_state_dict(preset, seed), path)
    return path
