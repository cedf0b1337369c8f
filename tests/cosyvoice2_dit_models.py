"""The CosyVoice2-DiT models of the test server: `cosyvoice2_dit` (decoupled) and `cosyvoice2_dit_offline` over
`cosyvoice2_token2wav_dit` (the tiny synthetic Step-Audio-2-mini token2wav), sharing the LLM models and the
audio tokenizer that cosyvoice2_models.build_cosyvoice2_models installs (list it first in TRITON_MODELS).
"""

from __future__ import annotations

from pathlib import Path

from cosyvoice2_models import (
    CHUNK_STRATEGY,
    COMMON,
    MAX_NEW_TOKENS,
    MAX_REFERENCE_SECONDS,
    MAX_TEXT_LENGTH,
    PRE_LOOKAHEAD_LEN,
    PREFIX,
    TEMPLATES,
    TOKEN_HOP_LEN,
    checkpoint_paths,
    install_template,
)

TOKEN2WAV_DIT = PREFIX + "token2wav_dit"
DIT_CHECKPOINT = "dit_token2wav_tiny"


def dit_token2wav_dir(data: Path) -> Path:
    return data / DIT_CHECKPOINT


def build_cosyvoice2_dit_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.dit_token2wav import write_dit_token2wav

    token2wav_dir = write_dit_token2wav(dit_token2wav_dir(data), "tiny", 0).resolve()
    llm_dir = checkpoint_paths(data.parent / "build_cosyvoice2_models").llm_dir.resolve()
    install_template(
        TEMPLATES,
        "token2wav_dit",
        repo,
        TOKEN2WAV_DIT,
        f"model_dir:{token2wav_dir},{COMMON},device:cpu,dtype:float32,instance_num:1,cuda_graphs:auto,cuda_graph_batch_sizes:1\\,2,flow_compile:false,max_reference_seconds:{MAX_REFERENCE_SECONDS},first_chunk_priority:false,first_chunks_first:true",
    )
    for name, decoupled, llm in (
        ("cosyvoice2_dit", True, "tensorrt_llm"),
        ("cosyvoice2_dit_offline", False, "tensorrt_llm_offline"),
    ):
        install_template(
            TEMPLATES, "cosyvoice2_dit", repo, name, dit_bls_values(llm_dir, decoupled, PREFIX + llm)
        )


def dit_bls_values(llm_dir: Path, decoupled: bool, llm: str, token2wav: str = TOKEN2WAV_DIT) -> str:
    """The `cosyvoice2_dit` template's values over the LLM model `llm` and the DiT token2wav `token2wav`."""
    return (
        f"llm_tokenizer_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},bls_instance_num:1,"
        f"token_hop_len:{TOKEN_HOP_LEN},pre_lookahead_len:{PRE_LOOKAHEAD_LEN},"
        f"dynamic_chunk_strategy:{CHUNK_STRATEGY},max_new_tokens:{MAX_NEW_TOKENS},"
        f"max_text_length:{MAX_TEXT_LENGTH},text_normalization:false,max_reference_seconds:{MAX_REFERENCE_SECONDS},"
        f"audio_tokenizer_model:{PREFIX}audio_tokenizer,token2wav_model:{token2wav},"
        f"tensorrt_llm_model:{llm},llm_endpoint:"
    )
