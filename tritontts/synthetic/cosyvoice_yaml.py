"""Pieces of the hub's HyperPyYAML that CosyVoice2's `cosyvoice2.yaml` and CosyVoice3's `cosyvoice3.yaml` share,
for the synthetic writers (tritontts.synthetic.cosyvoice2_flow, tritontts.synthetic.cosyvoice3). Each piece is
`str.format` template text: `{llm_size}`, `{hift_base_channels}` and `{f0_cond_channels}` are the presets' values."""

from __future__ import annotations

HEADER = """\
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
"""
LLM_BODY = """\
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

"""
FLOW_COMMON = """\
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
"""
CFM_DECODER = """\
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
"""
ESTIMATOR_CHUNKS = """\
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

"""
HIFT_BODY = """\
    in_channels: 80
    base_channels: {hift_base_channels}
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
"""
F0_BODY = """\
        num_class: 1
        in_channels: 80
        cond_channels: {f0_cond_channels}

"""
MEL_BODY = """\
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
"""
TOKENIZER_BODY = """\
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
"""


def llm_section(llm_class: str) -> str:
    return "llm: !new:cosyvoice.llm.llm." + llm_class + "\n" + LLM_BODY


def flow_head(flow_class: str, input_size: str) -> str:
    """The `flow:` tag and its scalar keys; the encoder and decoder sections follow."""
    return (
        "flow: !new:cosyvoice.flow.flow."
        + flow_class
        + "\n    input_size: "
        + input_size
        + "\n"
        + FLOW_COMMON
    )


def hift_section(generator: str, f0_predictor: str, extra: str = "") -> str:
    """`hift:` with upstream's sizes; `extra` (indented key lines) goes before its f0 predictor."""
    head = "hift: !new:cosyvoice.hifigan.generator." + generator + "\n"
    f0 = "    f0_predictor: !new:cosyvoice.hifigan.f0_predictor." + f0_predictor + "\n"
    return head + HIFT_BODY + extra + f0 + F0_BODY


def mel_spectrogram(name: str, fmax: str) -> str:
    """A matcha mel_spectrogram entry (n_fft 1920, hop 480, 80 bins) named `name`, up to `fmax`."""
    head = name + ": !name:matcha.utils.audio.mel_spectrogram\n"
    return head + MEL_BODY + "    fmax: " + fmax + "\n    center: False\n"


def qwen_tokenizer(extra: str = "") -> str:
    """`get_tokenizer` (`extra`: more of its key lines) and `allowed_special`."""
    head = "get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer\n"
    return head + TOKENIZER_BODY + extra + "allowed_special: 'all'\n"
