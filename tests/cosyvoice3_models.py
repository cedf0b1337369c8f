"""The CosyVoice3 model repository of the test server: model_repo_cosyvoice3's templates, filled by fill_template.py
under `cosyvoice3_*` names so they share the server with the other families' models.

`cosyvoice3` (decoupled, streaming) and `cosyvoice3_offline` call the `cosyvoice3_tensorrt_llm(_offline)` torch
engines inside Triton; `cosyvoice3_http` (decoupled) asks an OpenAI-compatible LLM server at `LLM_HTTP_PORT` instead
(upstream's topology; the test module starts `python -m tritontts.llm.openai_server` there). All three share the
leaf models `cosyvoice3_audio_tokenizer`, `cosyvoice3_speaker_embedding`, `cosyvoice3_token2wav`,
`cosyvoice3_vocoder`. Each BLS has one instance, so its voice cache is the one every request of that model sees.
The `text_inbox` model (bistream's text deltas) is model_repo_cosyvoice2's, as run.sh copies it.

Bistream has its own engines (`cosyvoice3_speech_llm(_offline)`, BLS `cosyvoice3_bistream`, and
`cosyvoice3_bistream_http` asking the LLM server at `BISTREAM_HTTP_PORT`) on the same checkpoint. Every engine and
LLM server serves from `<|s_0|>` on (run.sh's `--llm_output_tokens_from auto`), as upstream's speech-only head:
the converter copies Qwen's text rows into lm_head as upstream's does, and the tiny random model's text rows would
otherwise win in bistream segments (right after `<|endofprompt|>`), where a text id is an error.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cosyvoice2_models import (
    install_llm_engine,
    install_shared_models,
    install_template,
    install_text_inbox,
    reference_prompt,
)
from http_service import health_probe, start_python
from spark_models import COMMON
from waiting import wait_started

from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "model_repo_cosyvoice3"
PREFIX = "cosyvoice3_"
CHECKPOINT = "cosyvoice3_tiny"
MAX_NEW_TOKENS = 100
MAX_REFERENCE_SECONDS = 30
MAX_TEXT_LENGTH = 300
TOKEN_HOP_LEN = 15
PRE_LOOKAHEAD_LEN = 3
VOCODER_MAX_SECONDS = 60
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder")
LLM_HTTP_PORT, BISTREAM_HTTP_PORT = free_ports(2)
BISTREAM_BLS, BISTREAM_HTTP_BLS = PREFIX + "bistream", PREFIX + "bistream_http"


def checkpoint_root(data: Path) -> Path:
    return data / CHECKPOINT


def build_cosyvoice3_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.cosyvoice3_checkpoint import write_cosyvoice3_checkpoint

    root = write_cosyvoice3_checkpoint(checkpoint_root(data), "tiny", 0, **reference_prompt()).resolve()
    model_dir, llm_dir = root / MODEL_DIR, root / LLM_DIR
    install_shared_models(TEMPLATES, repo, PREFIX, model_dir, llm_dir)
    install_template(
        TEMPLATES,
        "vocoder",
        repo,
        PREFIX + "vocoder",
        f"model_dir:{model_dir},{COMMON},device:cpu,instance_num:1,max_seconds:{VOCODER_MAX_SECONDS},cuda_graphs:auto",
    )
    install_text_inbox(repo)
    for name, decoupled in (("speech_llm", True), ("speech_llm_offline", False)):
        install_llm_engine(repo, PREFIX + name, llm_dir, decoupled, 4)
    for name, decoupled, llm, api in (
        ("cosyvoice3", True, "tensorrt_llm", ""),
        ("cosyvoice3_offline", False, "tensorrt_llm_offline", ""),
        ("cosyvoice3_http", True, "none", f"http://127.0.0.1:{LLM_HTTP_PORT}/v1/chat/completions"),
        (BISTREAM_BLS, True, "speech_llm", ""),
        (BISTREAM_HTTP_BLS, True, "none", f"http://127.0.0.1:{BISTREAM_HTTP_PORT}/v1/chat/completions"),
    ):
        install_bls(repo, name, root, decoupled, llm, api)


def install_bls(
    repo: Path,
    name: str,
    root: Path,
    decoupled: bool,
    llm: str,
    api: str = "",
    token2wav: str = PREFIX + "token2wav",
) -> None:
    """A CosyVoice3 BLS of this repository over the checkpoint at `root`: its LLM is the engine `PREFIX + llm`, or
    with `llm` "none" the OpenAI-compatible server at `api`; `token2wav` is the token2wav model it calls."""
    leaves = {leaf: PREFIX + leaf for leaf in LEAVES} | {"token2wav": token2wav}
    install_template(
        TEMPLATES,
        "cosyvoice3",
        repo,
        name,
        f"model_dir:{root / MODEL_DIR},llm_tokenizer_dir:{root / LLM_DIR},{COMMON},decoupled_mode:{decoupled},"
        f"bls_instance_num:1,token_hop_len:{TOKEN_HOP_LEN},pre_lookahead_len:{PRE_LOOKAHEAD_LEN},"
        f"dynamic_chunk_strategy:exponential,max_new_tokens:{MAX_NEW_TOKENS},"
        f"max_text_length:{MAX_TEXT_LENGTH},text_normalization:false,max_reference_seconds:{MAX_REFERENCE_SECONDS},"
        + ",".join(f"{leaf}_model:{model}" for leaf, model in leaves.items())
        + f",tensorrt_llm_model:{PREFIX if llm != 'none' else ''}{llm},llm_api_base:{api}",
    )


@contextmanager
def openai_llm_server(
    model_dir: Path, log: Path, llm_dir: Path | None = None, port: int = LLM_HTTP_PORT
) -> Iterator[subprocess.Popen]:
    """`python -m tritontts.llm.openai_server` on the checkpoint's HF LLM (or `llm_dir`) at `port` (by default
    where the `cosyvoice3_http` BLS asks), until it answers /health; stopped on exit."""
    llm_dir = llm_dir or model_dir.parent / LLM_DIR
    command = [sys.executable, "-m", "tritontts.llm.openai_server", "--model-dir", str(llm_dir),
               "--port", str(port), "--device", "cpu", "--dtype", "float32", "--max-batch-size", "4",
               "--no-cuda-graphs", "--output-tokens-from", "<|s_0|>", "--log-level", "warning"]  # fmt: skip
    process = start_python(command, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_started(process, health_probe(url), f"the LLM server answering 200 on {url}/health", log)
        yield process
    finally:
        process.terminate()
        process.wait(timeout=30)
