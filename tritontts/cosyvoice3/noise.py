"""The fixed noise of CosyVoice3's causal NSF source, drawn as upstream draws it.

Upstream's `SineGen2(causal=True)` draws `rand(1, 9)` and then `rand(1, 300 * 24000, 9)` from torch's global
RNG while `cosyvoice3.yaml` is being built, and uses that tensor as the source noise of every call. The RNG
state there is set by `CausalConditionalCFM.__init__` (`set_all_random_seed(0)`, then the `randn(1, 80, 15000)`
flow noise) and advanced by every parameter initialised between that point and the sine generator, in
HyperPyYAML's construction order: the flow's `input_embedding` (normal) and `spk_embed_affine_layer`
(uniform weight, uniform bias), then the hift's f0 predictor (five convolutions and a linear layer, uniform
weight and bias each). We replay the same draws (same op, dtype and element count, which is what decides how
far the generator advances) on a private generator; `tests/test_cosyvoice3_hift.py` checks the result against
upstream's tensor.
"""

from __future__ import annotations

import torch

from tritontts.cosyvoice3.config import CausalHiFTConfig, Flow3Config

NOISE_SEED = 0
FLOW_NOISE_SHAPE = (1, 80, 50 * 300)  # hard-coded upstream, whatever the mel width
UPSTREAM_NOISE_SAMPLES = 300 * 24000
F0_CONV_KERNELS = (4, 3, 3, 3, 3)


def _skip(gen: torch.Generator, draw: str, *shape: int) -> None:
    tensor = torch.empty(*shape)
    if draw == "normal":
        tensor.normal_(generator=gen)
    else:
        tensor.uniform_(generator=gen)


def source_noise(flow: Flow3Config, hift: CausalHiFTConfig, samples: int) -> torch.Tensor:
    """The first `samples` rows of upstream's `SineGen2.sine_waves`: float32 [1, samples, nb_harmonics + 1]
    uniform in [0, 1)."""
    if samples > UPSTREAM_NOISE_SAMPLES:
        raise ValueError(f"upstream's source noise has {UPSTREAM_NOISE_SAMPLES} samples, {samples} asked")
    gen = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
    _skip(gen, "normal", *FLOW_NOISE_SHAPE)
    _skip(gen, "normal", flow.vocab_size, flow.input_size)
    _skip(gen, "uniform", flow.output_size, flow.spk_embed_dim)
    _skip(gen, "uniform", flow.output_size)
    cfg = hift.hift
    in_channels = cfg.f0_in_channels
    for kernel in F0_CONV_KERNELS:
        _skip(gen, "uniform", cfg.f0_cond_channels, in_channels, kernel)
        _skip(gen, "uniform", cfg.f0_cond_channels)
        in_channels = cfg.f0_cond_channels
    _skip(gen, "uniform", cfg.f0_num_class, cfg.f0_cond_channels)
    _skip(gen, "uniform", cfg.f0_num_class)
    harmonics = cfg.nb_harmonics + 1
    torch.rand(1, harmonics, generator=gen)  # rand_ini: read by no output sample
    return torch.rand(1, samples, harmonics, generator=gen)
