"""Random-weight BiCodec folders in the official layout: `config.yaml`, `BiCodec/config.yaml`,
`BiCodec/model.safetensors` (official key names and shapes; `full` = official dims, `tiny` = CPU-test size)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch
import yaml

from tritontts.checkpoint import write_safetensors
from tritontts.dsp.mel import MelSpectrogram
from tritontts.spark.bicodec import BiCodec
from tritontts.spark.config import BiCodecConfig
from tritontts.synthetic.presets import preset_entry

AUDIO_CONFIG: dict[str, Any] = {
    "sample_rate": 16000,
    "ref_segment_duration": 6,
    "latent_hop_length": 320,
    "volume_normalize": True,
    "highpass_cutoff_freq": 40,
    "segment_duration": 2.4,
    "max_val_duration": 12,
}

# Training-only quantizer keys: the loader ignores them; their values here are placeholders.
_TRAINING_ONLY_QUANTIZER_KEYS = {
    "commitment": 0.15,
    "codebook_loss_weight": 1.0,
    "threshold_ema_dead_code": 0.2,
}

FULL_CONFIG: dict[str, Any] = {
    "audio_tokenizer": {
        "mel_params": {
            "sample_rate": 16000,
            "n_fft": 1024,
            "win_length": 640,
            "hop_length": 320,
            "mel_fmin": 10,
            "mel_fmax": None,
            "num_mels": 128,
        },
        "encoder": {
            "input_channels": 1024,
            "vocos_dim": 384,
            "vocos_intermediate_dim": 2048,
            "vocos_num_layers": 12,
            "out_channels": 1024,
            "sample_ratios": [1, 1],
        },
        "decoder": {
            "input_channel": 1024,
            "channels": 1536,
            "rates": [8, 5, 4, 2],
            "kernel_sizes": [16, 11, 8, 4],
        },
        "quantizer": {
            "input_dim": 1024,
            "codebook_size": 8192,
            "codebook_dim": 8,
            "use_l2_normlize": True,
            **_TRAINING_ONLY_QUANTIZER_KEYS,
        },
        "speaker_encoder": {
            "input_dim": 128,
            "out_dim": 1024,
            "latent_dim": 128,
            "token_num": 32,
            "fsq_levels": [4, 4, 4, 4, 4, 4],
            "fsq_num_quantizers": 1,
        },
        "prenet": {
            "input_channels": 1024,
            "vocos_dim": 384,
            "vocos_intermediate_dim": 2048,
            "vocos_num_layers": 12,
            "out_channels": 1024,
            "condition_dim": 1024,
            "sample_ratios": [1, 1],
            "use_tanh_at_final": False,
        },
        "postnet": {
            "input_channels": 1024,
            "vocos_dim": 384,
            "vocos_intermediate_dim": 2048,
            "vocos_num_layers": 6,
            "out_channels": 1024,
            "use_tanh_at_final": False,
        },
    }
}


def _tiny_config() -> dict[str, Any]:
    config = copy.deepcopy(FULL_CONFIG)
    tok = config["audio_tokenizer"]
    tok["mel_params"]["num_mels"] = 32
    tok["encoder"].update(
        input_channels=32, vocos_dim=16, vocos_intermediate_dim=32, vocos_num_layers=2, out_channels=24
    )
    tok["decoder"].update(input_channel=24, channels=32)
    tok["quantizer"]["input_dim"] = 24
    tok["speaker_encoder"].update(input_dim=32, out_dim=24, latent_dim=16)
    vocos = {"input_channels": 24, "vocos_dim": 16, "vocos_intermediate_dim": 32, "out_channels": 24}
    tok["prenet"].update(vocos, vocos_num_layers=2, condition_dim=24)
    tok["postnet"].update(vocos, vocos_num_layers=1)
    return config


PRESETS = {"full": lambda: copy.deepcopy(FULL_CONFIG), "tiny": _tiny_config}


def preset_config(preset: str) -> BiCodecConfig:
    return BiCodecConfig.from_dict(preset_entry(PRESETS, preset)())


def full_state_shapes() -> dict[str, tuple[int, ...]]:
    """Key → shape of the official-size BiCodec state_dict, built on the meta device (nothing allocated)."""
    return {k: tuple(v.shape) for k, v in meta_state_dict("full").items()}


def meta_state_dict(preset: str = "full") -> dict[str, torch.Tensor]:
    with torch.device("meta"):
        model = BiCodec(preset_config(preset))
    return model.state_dict()


def _random_tensor(name: str, like: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A CPU tensor of `like`'s shape (`like` may be on the meta device)."""

    def full(value: float) -> torch.Tensor:
        return torch.full(like.shape, value, dtype=like.dtype)

    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("num_batches_tracked", "running_mean", "cluster_size"):
        return full(0.0)
    if leaf == "bias":
        return full(1.0 if ".norm.scale." in name else 0.0)  # AdaLayerNorm starts at unit scale
    if leaf in ("running_var", "alpha") or (leaf == "weight" and like.dim() == 1):
        return full(1.0)
    if leaf == "gamma":
        return full(1.0 if "perceiver" in name else 0.1)
    std = 1.0 if name.endswith("codebook.weight") or leaf == "latents" else _gain(name, like)
    if like.dim() > 1 and not name.endswith("codebook.weight"):
        std /= math.sqrt(math.prod(like.shape[1:]))
    return torch.randn(like.shape, generator=gen) * std


def _gain(name: str, like: torch.Tensor) -> float:
    """Small where a product of random layers would otherwise grow (keeps the audio off tanh's rails)."""
    if ".norm.scale." in name or ".norm.shift." in name:
        return 0.1
    if name.startswith("decoder.") and name.endswith("block.3.weight_v"):
        return 0.25
    if name.startswith("decoder.") and name.endswith("weight_v") and like.shape[0] == 1:
        return 0.02
    return 1.0


def random_state_dict(cfg: BiCodecConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights (seeded, key order fixed) with the mel window/filterbank at their true values."""
    with torch.device("meta"):
        shapes = BiCodec(cfg).state_dict()
    mel = MelSpectrogram(
        cfg.mel_params.sample_rate,
        cfg.mel_params.n_fft,
        cfg.mel_params.win_length,
        cfg.mel_params.hop_length,
        cfg.mel_params.mel_fmin,
        cfg.mel_params.mel_fmax,
        n_mels=cfg.mel_params.num_mels,
        power=1.0,
        norm="slaney",
        mel_scale="slaney",
    )
    out = {f"mel_transformer.{k}": v for k, v in mel.state_dict().items()}
    gen = torch.Generator().manual_seed(seed)
    for name in sorted(shapes):
        if name not in out and not name.endswith("weight_g"):
            out[name] = _random_tensor(name, shapes[name], gen)
    for name in sorted(shapes):
        if name.endswith("weight_g"):
            v = out[name[: -len("g")] + "v"]
            out[name] = v.pow(2).sum(dim=tuple(range(1, v.dim())), keepdim=True).sqrt()
    return {name: out[name].contiguous() for name in shapes}


def write_bicodec(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> None:
    """Write `config.yaml`, `BiCodec/config.yaml` and `BiCodec/model.safetensors` under `model_dir`."""
    model_dir = Path(model_dir)
    raw = preset_entry(PRESETS, preset)()
    (model_dir / "BiCodec").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(AUDIO_CONFIG, sort_keys=False))
    (model_dir / "BiCodec" / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    state = random_state_dict(BiCodecConfig.from_dict(raw), seed)
    write_safetensors(state, model_dir / "BiCodec" / "model.safetensors")
