"""Random-weight Fun-CosyVoice3-0.5B-2512 token2wav files in the official layout.

`cosyvoice3.yaml` (HyperPyYAML with upstream's tags: upstream's `load_hyperpyyaml` builds its modules from it),
`flow.pt`, `hift.pt` (torch-saved fp32 state_dicts with upstream's keys, shapes and order),
`speech_tokenizer_v3.onnx` and `campplus.onnx` (CosyVoice2's synthetic front-end graphs under the v3 name).
`full` = the recipe's dims (`examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`), `tiny` = CPU-test dims.
The same preset and seed give the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tritontts.cosyvoice2.hift import HIFT_FILE
from tritontts.cosyvoice3.config import CONFIG_FILE, CosyVoice3Config, cosyvoice3_config_from_text
from tritontts.cosyvoice3.dit import RotaryEmbedding
from tritontts.cosyvoice3.flow import FLOW_FILE, Flow3
from tritontts.cosyvoice3.hift import CausalHiFT
from tritontts.synthetic import cosyvoice_yaml as yaml_pieces
from tritontts.synthetic.cosyvoice2_hift import hift_tensor, set_weight_norm_gains
from tritontts.synthetic.cosyvoice2_onnx import write_campplus_onnx, write_speech_tokenizer_onnx
from tritontts.synthetic.flow_weights import flow_tensor, seeded_state_dict
from tritontts.synthetic.presets import preset_entry

MODEL_DIR = "Fun-CosyVoice3-0.5B-2512"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v3.onnx"
CAMPPLUS_FILE = "campplus.onnx"

PRESET_VALUES: dict[str, dict[str, int]] = {
    "full": {"llm_size": 896, "lookahead": 1024, "dim": 1024, "depth": 22, "heads": 16, "dim_head": 64,
             "hift_base_channels": 512, "f0_cond_channels": 512},
    "tiny": {"llm_size": 64, "lookahead": 64, "dim": 64, "depth": 2, "heads": 4, "dim_head": 16,
             "hift_base_channels": 32, "f0_cond_channels": 32},
}  # fmt: skip

_FLOW_MODULES = """\
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead}
        pre_lookahead_len: 3
"""
_ESTIMATOR = """\
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dim}
            depth: {depth}
            heads: {heads}
            dim_head: {dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
"""
_TEMPLATE = (
    yaml_pieces.HEADER
    + "num_decoding_left_chunks: -1\n\n"
    + yaml_pieces.llm_section("CosyVoice3LM")
    + yaml_pieces.flow_head("CausalMaskedDiffWithDiT", "80")
    + _FLOW_MODULES
    + yaml_pieces.CFM_DECODER
    + _ESTIMATOR
    + yaml_pieces.ESTIMATOR_CHUNKS
    + yaml_pieces.hift_section(
        "CausalHiFTGenerator", "CausalConvRNNF0Predictor", "    conv_pre_look_right: 4\n"
    )
    + yaml_pieces.qwen_tokenizer("    version: cosyvoice3\n")
    + yaml_pieces.mel_spectrogram("feat_extractor", "null")
)


def cosyvoice3_yaml(preset: str) -> str:
    return _TEMPLATE.format(**preset_entry(PRESET_VALUES, preset))


def preset_config(preset: str) -> CosyVoice3Config:
    return cosyvoice3_config_from_text(cosyvoice3_yaml(preset), f"{preset} preset")


def _flow_tensor(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    if name.endswith("rotary_embed.inv_freq"):  # a buffer upstream saves: the formula, not weights
        return RotaryEmbedding(shape[0] * 2).inv_freq
    return flow_tensor(name, shape, gen)


def random_flow_state_dict(config: CosyVoice3Config, seed: int = 0) -> dict[str, torch.Tensor]:
    return seeded_state_dict(lambda: Flow3(config.flow), _flow_tensor, seed)


def _hift_tensor(name: str, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    return hift_tensor(name, shape, gen, transposed_ups=False)  # CausalHiFT upsamples with plain convolutions


def random_hift_state_dict(config: CosyVoice3Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights; each weight-norm gain is its direction's norm (so weight = direction)."""
    state = seeded_state_dict(lambda: CausalHiFT(config.hift), _hift_tensor, seed)
    set_weight_norm_gains(state)
    return state


def write_cosyvoice3_token2wav(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write cosyvoice3.yaml, flow.pt, hift.pt and the two front-end ONNX files into `model_dir`."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    text = cosyvoice3_yaml(preset)
    (model_dir / CONFIG_FILE).write_text(text)
    config = cosyvoice3_config_from_text(text)
    torch.save(random_flow_state_dict(config, seed), model_dir / FLOW_FILE)
    torch.save(random_hift_state_dict(config, seed + 1), model_dir / HIFT_FILE)
    write_speech_tokenizer_onnx(model_dir / SPEECH_TOKENIZER_FILE, preset, seed)
    write_campplus_onnx(model_dir / CAMPPLUS_FILE, preset, seed)
    return model_dir
