"""Random-weight CosyVoice2 flow in the official layout: `cosyvoice2.yaml` (the hub's HyperPyYAML, tags
included, every section of the reference) and `flow.pt` (a torch-saved fp32 state_dict with the official
keys and shapes). `full` = the reference dims, `tiny` = CPU-test dims. The same preset and seed give the
same bytes."""

from __future__ import annotations

from pathlib import Path

import torch

from tritontts.cosyvoice2.config import CosyVoice2Config, FlowConfig, cosyvoice2_config_from_text
from tritontts.cosyvoice2.flow import FLOW_FILE, Flow
from tritontts.synthetic import cosyvoice_yaml as yaml_pieces
from tritontts.synthetic.flow_weights import flow_tensor, seeded_state_dict
from tritontts.synthetic.presets import preset_entry

CONFIG_FILE = "cosyvoice2.yaml"

PRESET_VALUES: dict[str, dict[str, object]] = {
    "full": {
        "llm_size": 896,
        "flow_input_size": 512,
        "encoder_size": 512,
        "attention_heads": 8,
        "linear_units": 2048,
        "num_blocks": 6,
        "estimator_channels": "[256]",
        "attention_head_dim": 64,
        "n_blocks": 4,
        "num_mid_blocks": 12,
        "num_heads": 8,
        "hift_base_channels": 512,
        "f0_cond_channels": 512,
    },
    "tiny": {
        "llm_size": 64,
        "flow_input_size": 64,
        "encoder_size": 64,
        "attention_heads": 2,
        "linear_units": 128,
        "num_blocks": 2,
        "estimator_channels": "[64]",
        "attention_head_dim": 32,
        "n_blocks": 1,
        "num_mid_blocks": 2,
        "num_heads": 2,
        "hift_base_channels": 32,
        "f0_cond_channels": 32,
    },
}

_ENCODER = """\
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {encoder_size}
        attention_heads: {attention_heads}
        linear_units: {linear_units}
        num_blocks: {num_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {flow_input_size}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <chunk_size>
"""
_ESTIMATOR = """\
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: {estimator_channels}
            dropout: 0.0
            attention_head_dim: {attention_head_dim}
            n_blocks: {n_blocks}
            num_mid_blocks: {num_mid_blocks}
            num_heads: {num_heads}
            act_fn: 'gelu'
"""
_GAN = """\
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResSpecDiscriminator
    mel_spec_transform: [
        !ref <mel_spec_transform1>
    ]

# processor functions
parquet_opener: !name:cosyvoice.dataset.processor.parquet_opener
"""
_DATA_FUNCTIONS = """\
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
    allowed_special: !ref <allowed_special>
filter: !name:cosyvoice.dataset.processor.filter
    max_length: 6000
    min_length: 100
    token_max_length: 200
    token_min_length: 1
resample: !name:cosyvoice.dataset.processor.resample
    resample_rate: !ref <sample_rate>
truncate: !name:cosyvoice.dataset.processor.truncate
    truncate_length: 24480 # must be a multiplier of hop_size
"""
_DATA_PIPELINE = """\
compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
    num_frames: 960
compute_whisper_fbank: !name:cosyvoice.dataset.processor.compute_whisper_fbank
    num_frames: 960
compute_f0: !name:cosyvoice.dataset.processor.compute_f0
    sample_rate: !ref <sample_rate>
    hop_size: 480
parse_embedding: !name:cosyvoice.dataset.processor.parse_embedding
    normalize: True
shuffle: !name:cosyvoice.dataset.processor.shuffle
    shuffle_size: 1000
sort: !name:cosyvoice.dataset.processor.sort
    sort_size: 500  # sort_size should be less than shuffle_size
batch: !name:cosyvoice.dataset.processor.batch
    batch_type: 'dynamic'
    max_frames_in_batch: 2000
padding: !name:cosyvoice.dataset.processor.padding
    use_spk_embedding: False # change to True during sft

# dataset processor pipeline
data_pipeline: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <compute_fbank>,
    !ref <parse_embedding>,
    !ref <compute_whisper_fbank>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]
data_pipeline_gan: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <truncate>,
    !ref <compute_fbank>,
    !ref <compute_f0>,
    !ref <parse_embedding>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]

# llm flow train conf
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5 # change to 1e-5 during sft
    scheduler: constantlr # change to constantlr during sft
    scheduler_conf:
        warmup_steps: 2500
    max_epoch: 200
    grad_clip: 5
    accum_grad: 2
    log_interval: 100
    save_per_step: -1

# gan train conf
train_conf_gan:
    optim: adam
    optim_conf:
        lr: 0.0002 # use small lr for gan training
    scheduler: constantlr
    optim_d: adam
    optim_conf_d:
        lr: 0.0002 # use small lr for gan training
    scheduler_d: constantlr
    max_epoch: 200
    grad_clip: 5
    accum_grad: 1 # in gan training, accum_grad must be 1
    log_interval: 100
    save_per_step: -1
"""
_TEMPLATE = (
    yaml_pieces.HEADER
    + "num_decoding_left_chunks: -1 # streaming inference flow decoder left chunk size, <0 means use all left chunks\n"
    + "\n# model params\n"
    + yaml_pieces.llm_section("Qwen2LM")
    + yaml_pieces.flow_head("CausalMaskedDiffWithXvec", "{flow_input_size}")
    + _ENCODER
    + yaml_pieces.CFM_DECODER
    + _ESTIMATOR
    + yaml_pieces.ESTIMATOR_CHUNKS
    + yaml_pieces.hift_section("HiFTGenerator", "ConvRNNF0Predictor")
    + "# gan related module\n"
    + yaml_pieces.mel_spectrogram("mel_spec_transform1", "null")
    + _GAN
    + yaml_pieces.qwen_tokenizer()
    + _DATA_FUNCTIONS
    + yaml_pieces.mel_spectrogram("feat_extractor", "8000")
    + _DATA_PIPELINE
)


def cosyvoice2_yaml(preset: str) -> str:
    """`cosyvoice2.yaml` text in the hub's format for `preset` (`full` = reference values)."""
    return _TEMPLATE.format(**preset_entry(PRESET_VALUES, preset))


def preset_config(preset: str) -> CosyVoice2Config:
    return cosyvoice2_config_from_text(cosyvoice2_yaml(preset), f"{preset} preset")


def write_cosyvoice2_yaml(model_dir: str | Path, preset: str) -> Path:
    path = Path(model_dir) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(cosyvoice2_yaml(preset))
    return path


def random_flow_state_dict(config: FlowConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random fp32 weights with the official keys, shapes and key order."""
    return seeded_state_dict(lambda: Flow(config), flow_tensor, seed)


def write_flow(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write `cosyvoice2.yaml` and `flow.pt` under `model_dir`; returns the path of `flow.pt`."""
    preset_entry(PRESET_VALUES, preset)
    model_dir = Path(model_dir)
    write_cosyvoice2_yaml(model_dir, preset)
    state = random_flow_state_dict(preset_config(preset).flow, seed)
    path = model_dir / FLOW_FILE
    torch.save(state, path)
    return path
