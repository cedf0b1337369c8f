"""Random-weight Fun-CosyVoice3-0.5B-2512 token2wav files in the official layout.

`cosyvoice3.yaml` (HyperPyYAML with upstream's tags: upstream's `load_hyperpyyaml` builds its modules from it),
`flow.pt`, `hift.pt` (torch-saved fp32 state_dicts with upstream's keys, shapes and order),
`speech_tokenizer_v3.onnx` and `campplus.onnx` (CosyVoice2's synthetic front-end graphs under the v3 name).
`full` = the recipe's dims (`examples/libritts/cosyvoice3/conf/cosyvoice3.yaml`), `tiny` = CPU-test dims.
The same preset and seed give the same bytes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tritontts.cosyvoice2.hift import HIFT_FILE
from tritontts.cosyvoice3.config import CONFIG_FILE, CosyVoice3Config, cosyvoice3_config_from_text
from tritontts.cosyvoice3.dit import RotaryEmbedding
from tritontts.cosyvoice3.flow import FLOW_FILE, Flow3
from tritontts.cosyvoice3.hift import CausalHiFT
from tritontts.synthetic.cosyvoice2_hift import CONV_POST_GAIN, F0_MEAN_HZ, F0_SPREAD_HZ
from tritontts.synthetic.cosyvoice2_onnx import write_campplus_onnx, write_speech_tokenizer_onnx
from tritontts.synthetic.flow_weights import flow_tensor, seeded_state_dict
from tritontts.synthetic.presets import preset_entry

MODEL_DIR = "Fun-CosyVoice3-0.5B-2512"
SPEECH_TOKENIZER_FILE = "speech_tokenizer_v3.onnx"
CAMPPLUS_FILE = "campplus.onnx"

PRESET_VALUES: dict[str, dict[str, int]] = {
    "full": {"llm_size": 896, "lookahead": 1024, "dim": 1024, "depth": 22, "heads": 16, "dim_head": 64,
             "hift_base": 512, "f0_cond": 512},
    "tiny": {"llm_size": 64, "lookahead": 64, "dim": 64, "depth": 2, "heads": 4, "dim_head": 16,
             "hift_base": 32, "f0_cond": 32},
}  # fmt: skip

_TEMPLATE = """\
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

# fixed params
sample_rate: 24000
llm_input_size: {llm_size}
llm_output_size: {llm_size}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

# stream related params
chunk_size: 25 # streaming inference chunk size, in token
num_decoding_left_chunks: -1

llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
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
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_base}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_cond}

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
    version: cosyvoice3
allowed_special: 'all'
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
"""


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
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "alpha":
        return torch.ones(shape)
    if name == "f0_predictor.classifier.bias":
        return torch.full(shape, F0_MEAN_HZ)
    if leaf == "bias":
        return torch.zeros(shape)
    std = 1.0 / math.sqrt(math.prod(shape[1:]))
    if name == "f0_predictor.classifier.weight":
        std *= F0_SPREAD_HZ
    if name.startswith("conv_post."):
        std *= CONV_POST_GAIN
    return torch.randn(shape, generator=gen) * std


def random_hift_state_dict(config: CosyVoice3Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights; each weight-norm gain is its direction's norm (so weight = direction)."""
    state = seeded_state_dict(lambda: CausalHiFT(config.hift), _hift_tensor, seed)
    for name in state:
        if name.endswith("original0"):
            direction = state[name[:-1] + "1"]
            state[name] = direction.pow(2).sum(dim=(1, 2), keepdim=True).sqrt()
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
