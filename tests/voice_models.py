"""A Spark-TTS deployment for voice creation on the test server: `voice_spark_tts` (decoupled) and
`voice_spark_tts_offline` over an LLM that speaks global as well as semantic tokens.

The tiny synthetic Spark LLM of spark_models speaks semantic tokens only (as a cloning prompt asks); voice
creation needs the LLM to make the speaker's 32 global tokens too, so this one favours both ranges (the
`speech_tokens` option of the synthetic writer). The BLS models share `audio_tokenizer` and `vocoder` with
spark_models.build_spark_models (list it first in TRITON_MODELS).
"""

from __future__ import annotations

from pathlib import Path

from spark_models import COMMON, STREAMING, install

from tritontts.spark import tokens

CREATE_MAX_NEW_TOKENS = 300  # about a third global tokens: far more than the 32 a created voice needs
LLM = {"voice_spark_tts": "voice_tensorrt_llm", "voice_spark_tts_offline": "voice_tensorrt_llm_offline"}


def build_voice_spark_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.spark import write_spark_llm

    llm_dir = (data / "spark_create" / "LLM").resolve()
    if not (llm_dir / "config.json").exists():
        write_spark_llm(
            llm_dir,
            "tiny",
            0,
            speech_tokens=(tokens.GLOBAL_BASE, tokens.SEMANTIC_BASE + tokens.SEMANTIC_COUNT),
            counter=None,  # the length counter would end a short text's utterance before 32 global tokens
        )
    for bls, llm in LLM.items():
        decoupled = not bls.endswith("offline")
        install(
            "tensorrt_llm_torch",
            repo,
            llm,
            f"model_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},llm_max_batch_size:4,"
            "llm_max_seq_len:1024,llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false,llm_decode_attention:auto,llm_decode_linear:auto,llm_decode_pdl:auto,llm_stream_interval:auto,"
            f"llm_output_tokens_from:{tokens.OUTPUT_WINDOW_FROM},first_chunk_priority:false,audio_tokens_per_s:25,first_chunk_tokens:18",
        )
        path = install(
            "spark_tts",
            repo,
            bls,
            f"bls_instance_num:1,llm_tokenizer_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},{STREAMING},"
            f"max_new_tokens:{CREATE_MAX_NEW_TOKENS},max_text_length:300,text_normalization:false,max_reference_seconds:30",
        )
        config = path / "config.pbtxt"
        config.write_text(
            config.read_text().replace(
                '  { key: "voice_cache_size"',
                f'  {{ key: "tensorrt_llm_model", value: {{ string_value: "{llm}" }} }},\n  {{ key: "voice_cache_size"',
            )
        )
