"""A random-weight Step-Audio-2-mini `token2wav/` folder: flow.yaml (HyperPyYAML, the hub's four tags),
flow.pt (fp32 state_dict, official keys and shapes), hift.pt (HiFTGenerator's defaults for `full`),
campplus.onnx and speech_tokenizer_v2_25hz.onnx (stand-ins with the real inputs and outputs).

`full` has the real dims (writing it takes ~0.7 GB of disk, ~1 GB of memory and ~10 s of CPU); `tiny` is for CPU
tests. The same preset and seed give the same bytes (the ONNX files as torch exports them).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tritontts.dit_token2wav.config import DiTFlowConfig, dit_flow_config_from_text
from tritontts.dit_token2wav.flow import FLOW_FILE, DiTFlow
from tritontts.dit_token2wav.token2wav import CAMPPLUS_FILE, FLOW_YAML, HIFT_FILE, SPEECH_TOKENIZER_FILE
from tritontts.synthetic.flow_weights import flow_tensor, seeded_state_dict
from tritontts.synthetic.presets import preset_entry

MARKER = "SYNTHETIC.json"
FILES = (FLOW_YAML, FLOW_FILE, HIFT_FILE, CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE)

PRESET_VALUES: dict[str, dict[str, object]] = {
    "full": {
        "size": 512,
        "num_blocks": 6,
        "num_up_blocks": 4,
        "attention_heads": 8,
        "linear_units": 2048,
        "mlp_ratio": 4.0,
        "depth": 16,
        "num_heads": 8,
        "head_dim": 64,
        "hidden_size": 512,
    },
    "tiny": {
        "size": 64,
        "num_blocks": 2,
        "num_up_blocks": 2,
        "attention_heads": 2,
        "linear_units": 128,
        "mlp_ratio": 2.0,
        "depth": 2,
        "num_heads": 2,
        "head_dim": 16,
        "hidden_size": 64,
    },
}

_TEMPLATE = """\
flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec
    input_size: {size}
    output_size: 80
    spk_embed_dim: 192
    output_type: 'mel'
    vocab_size: 6561
    encoder: !new:cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2
        input_size: {size}
        output_size: {size}
        input_layer: 'linear'
        pre_lookahead_len: 3
        num_blocks: {num_blocks}
        num_up_blocks: {num_up_blocks}
        up_stride: 2
        up_scale_factor: 2
        attention_heads: {attention_heads}
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        key_bias: true
        linear_units: {linear_units}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: true
    decoder: !new:cosyvoice2.flow.flow_matching.CausalConditionalCFM
        inference_cfg_rate: 0.7
        estimator: !new:cosyvoice2.flow.decoder_dit.DiT
            in_channels: 320
            out_channels: 80
            mlp_ratio: {mlp_ratio}
            depth: {depth}
            num_heads: {num_heads}
            head_dim: {head_dim}
            hidden_size: {hidden_size}
"""


def flow_yaml(preset: str) -> str:
    """flow.yaml text in the hub's format for `preset`."""
    return _TEMPLATE.format(**preset_entry(PRESET_VALUES, preset))


def preset_config(preset: str) -> DiTFlowConfig:
    return dit_flow_config_from_text(flow_yaml(preset), f"{preset} preset")


def _dit_tensor(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """The flows' random weights, with the adaLN matrices scaled down so the random DiT keeps its activations
    near unit scale."""
    tensor = flow_tensor(name, shape, gen)
    return tensor * 0.3 if "adaLN_modulation" in name and len(shape) > 1 else tensor


def random_flow_state_dict(config: DiTFlowConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random fp32 weights with the official keys, shapes and key order."""
    return seeded_state_dict(lambda: DiTFlow(config), _dit_tensor, seed)


def write_flow(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """flow.yaml and flow.pt into `out_dir`; returns flow.pt's path."""
    preset_entry(PRESET_VALUES, preset)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / FLOW_YAML).write_text(flow_yaml(preset))
    state = random_flow_state_dict(preset_config(preset), seed)
    torch.save(state, out_dir / FLOW_FILE)
    return out_dir / FLOW_FILE


def is_complete(out_dir: str | Path, preset: str, seed: int) -> bool:
    out_dir = Path(out_dir)
    marker = out_dir / MARKER
    if not marker.is_file() or any(not (out_dir / name).is_file() for name in FILES):
        return False
    written = json.loads(marker.read_text())
    return written.get("preset") == preset and written.get("seed") == seed


def write_dit_token2wav(out_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the five token2wav files (and SYNTHETIC.json) into `out_dir`; returns `out_dir`."""
    preset_entry(PRESET_VALUES, preset)
    from tritontts.synthetic.cosyvoice2_hift import write_hift
    from tritontts.synthetic.cosyvoice2_onnx import write_campplus_onnx, write_speech_tokenizer_onnx

    out_dir = Path(out_dir)
    write_flow(out_dir, preset, seed)
    write_hift(out_dir, preset, seed)
    write_campplus_onnx(out_dir / CAMPPLUS_FILE, preset, seed)
    write_speech_tokenizer_onnx(out_dir / SPEECH_TOKENIZER_FILE, preset, seed)
    marker = {"model": "step_audio2_token2wav", "preset": preset, "seed": seed, "note": "random weights"}
    (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    return out_dir
