"""The CosyVoice3 model repository of the test server: model_repo_cosyvoice3's templates, filled by fill_template.py
under `cosyvoice3_*` names so they share the server with the other families' models.

`cosyvoice3` (decoupled, streaming) and `cosyvoice3_offline` call the `cosyvoice3_tensorrt_llm(_offline)` torch
engines inside Triton; `cosyvoice3_http` (decoupled) asks an OpenAI-compatible LLM server at `LLM_HTTP_PORT` instead
(upstream's topology; the test module starts `python -m tritontts.llm.openai_server` there). All three share the
leaf models `cosyvoice3_audio_tokenizer`, `cosyvoice3_speaker_embedding`, `cosyvoice3_token2wav`,
`cosyvoice3_vocoder`. Each BLS has one instance, so its voice cache is the one every request of that model sees.
"""

from __future__ import annotations

from pathlib import Path

from conftest import PROMPT_ZH, PROMPT_ZH_TEXT
from cosyvoice2_models import install_template
from spark_models import COMMON

from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "model_repo_cosyvoice3"
LLM_TEMPLATES = ROOT / "model_repo"
PREFIX = "cosyvoice3_"
CHECKPOINT = "cosyvoice3_tiny"
MAX_NEW_TOKENS = 100
MAX_REFERENCE_SECONDS = 30
MAX_TEXT_LENGTH = 300
TOKEN_HOP_LEN = 15
PRE_LOOKAHEAD_LEN = 3
VOCODER_MAX_SECONDS = 60
LLM_SLOTS = {"tensorrt_llm": 4, "tensorrt_llm_offline": 8}
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder")
(LLM_HTTP_PORT,) = free_ports(1)


def checkpoint_root(data: Path) -> Path:
    return data / CHECKPOINT


def build_cosyvoice3_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.cosyvoice3_checkpoint import write_cosyvoice3_checkpoint

    prompt = {"prompt_wav": PROMPT_ZH, "prompt_text": PROMPT_ZH_TEXT} if PROMPT_ZH.exists() else {}
    root = write_cosyvoice3_checkpoint(checkpoint_root(data), "tiny", 0, **prompt).resolve()
    model_dir, llm_dir = root / MODEL_DIR, root / LLM_DIR
    front = f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,max_reference_seconds:{MAX_REFERENCE_SECONDS}"
    for leaf in ("audio_tokenizer", "speaker_embedding"):
        install_template(TEMPLATES, leaf, repo, PREFIX + leaf, front)
    install_template(
        TEMPLATES,
        "token2wav",
        repo,
        PREFIX + "token2wav",
        f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32,cuda_graphs:auto,instance_num:1,"
        "cuda_graph_batch_sizes:1\\,2",
    )
    install_template(
        TEMPLATES,
        "vocoder",
        repo,
        PREFIX + "vocoder",
        f"model_dir:{model_dir},{COMMON},device:cpu,instance_num:1,max_seconds:{VOCODER_MAX_SECONDS}",
    )
    for llm, slots in LLM_SLOTS.items():
        install_template(
            LLM_TEMPLATES,
            "tensorrt_llm_torch",
            repo,
            PREFIX + llm,
            f"model_dir:{llm_dir},{COMMON},decoupled_mode:{llm == 'tensorrt_llm'},llm_max_batch_size:{slots},"
            "llm_max_seq_len:1024,llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false",
        )
    leaves = ",".join(f"{leaf}_model:{PREFIX}{leaf}" for leaf in LEAVES)
    for name, decoupled, llm, api in (
        ("cosyvoice3", True, "tensorrt_llm", ""),
        ("cosyvoice3_offline", False, "tensorrt_llm_offline", ""),
        ("cosyvoice3_http", True, "none", f"http://127.0.0.1:{LLM_HTTP_PORT}/v1/chat/completions"),
    ):
        install_template(
            TEMPLATES,
            "cosyvoice3",
            repo,
            name,
            f"model_dir:{model_dir},llm_tokenizer_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},"
            f"bls_instance_num:1,token_hop_len:{TOKEN_HOP_LEN},pre_lookahead_len:{PRE_LOOKAHEAD_LEN},"
            f"dynamic_chunk_strategy:exponential,max_new_tokens:{MAX_NEW_TOKENS},"
            f"max_text_length:{MAX_TEXT_LENGTH},max_reference_seconds:{MAX_REFERENCE_SECONDS},"
            f"{leaves},tensorrt_llm_model:{PREFIX if llm != 'none' else ''}{llm},llm_api_base:{api}",
        )
