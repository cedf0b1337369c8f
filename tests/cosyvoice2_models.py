"""The CosyVoice2 model repository of the test server: model_repo_cosyvoice2's templates, filled by
fill_template.py under `cosyvoice2_*` names so they share the server with Spark-TTS's models.

`cosyvoice2` + `cosyvoice2_tensorrt_llm` are decoupled (streaming); `cosyvoice2_offline` +
`cosyvoice2_tensorrt_llm_offline` are not. `cosyvoice2_http` (decoupled) asks an OpenAI-compatible LLM server at
`LLM_HTTP_PORT` (`llm_endpoint`; the test module starts it). Both BLS models call the same `cosyvoice2_audio_tokenizer`,
`cosyvoice2_speaker_embedding` and `cosyvoice2_token2wav`. Each BLS has one instance, so its voice cache is
the one every request of that model sees.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from conftest import PROMPT_ZH, PROMPT_ZH_TEXT
from spark_models import COMMON, install

from tritontts.synthetic.cosyvoice2 import Cosyvoice2Paths
from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "model_repo_cosyvoice2"
LLM_TEMPLATES = ROOT / "model_repo"
PREFIX = "cosyvoice2_"
MAX_NEW_TOKENS = 100
MAX_REFERENCE_SECONDS = 30
MAX_TEXT_LENGTH = 300
TOKEN_HOP_LEN = 15
PRE_LOOKAHEAD_LEN = 3
CHUNK_STRATEGY = "exponential"
TIME_BASED = PREFIX + "time_based"
"""A streaming BLS with upstream's time_based chunk strategy (tests/test_chunk_strategy.py)."""
LLM_SLOTS = {"tensorrt_llm": 4, "tensorrt_llm_offline": 8}
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav")
CHECKPOINT = "cosyvoice2_tiny"
TEXT_INBOX = "text_inbox"
"""bistream's text inbox (tritontts.triton.text_inbox), unprefixed: the BLS configs name it so"""
HTTP_BLS = PREFIX + "http"
(LLM_HTTP_PORT,) = free_ports(1)


def checkpoint_paths(data: Path) -> Cosyvoice2Paths:
    return Cosyvoice2Paths.under(data / CHECKPOINT)


def build_cosyvoice2_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.cosyvoice2 import write_cosyvoice2_checkpoint

    paths = write_cosyvoice2_checkpoint(data / CHECKPOINT, "tiny", 0, **reference_prompt())
    model_dir, llm_dir = paths.model_dir.resolve(), paths.llm_dir.resolve()
    install_shared_models(TEMPLATES, repo, PREFIX, model_dir, llm_dir)
    for name, decoupled, llm in (
        ("cosyvoice2", True, "tensorrt_llm"),
        ("cosyvoice2_offline", False, "tensorrt_llm_offline"),
    ):
        install_template(TEMPLATES, "cosyvoice2", repo, name, bls_values(model_dir, llm_dir, decoupled, llm))
    install_text_inbox(repo)
    endpoint = f"http://127.0.0.1:{LLM_HTTP_PORT}/v1/chat/completions"
    install_template(
        TEMPLATES,
        "cosyvoice2",
        repo,
        HTTP_BLS,
        bls_values(model_dir, llm_dir, True, "none", endpoint=endpoint),
    )
    install_template(
        TEMPLATES,
        "cosyvoice2",
        repo,
        TIME_BASED,
        bls_values(model_dir, llm_dir, True, "tensorrt_llm", strategy="time_based"),
    )


def reference_prompt() -> dict:
    """The synthetic checkpoint's speaker "001" from the test recording and its transcript, when present."""
    return {"prompt_wav": PROMPT_ZH, "prompt_text": PROMPT_ZH_TEXT} if PROMPT_ZH.exists() else {}


def install_shared_models(templates: Path, repo: Path, prefix: str, model_dir: Path, llm_dir: Path) -> None:
    """A CosyVoice repository's front-end leaves and token2wav (from `templates`) and its two torch LLM engines
    (streaming and offline), named `prefix + role`, all on CPU in float32."""
    front = (  # onnx_threads: run.sh's default, upstream's 1 intra-op thread per ONNX front end
        f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,onnx_threads:1,"
        f"max_reference_seconds:{MAX_REFERENCE_SECONDS}"
    )
    for leaf in ("audio_tokenizer", "speaker_embedding"):
        install_template(templates, leaf, repo, prefix + leaf, front)
    install_token2wav(templates, repo, prefix + "token2wav", model_dir)
    for llm, slots in LLM_SLOTS.items():
        install_llm_engine(repo, prefix + llm, llm_dir, llm == "tensorrt_llm", slots)


def install_token2wav(
    templates: Path,
    repo: Path,
    name: str,
    model_dir: Path,
    priority: bool = False,
    first_chunks_first: str = "true",
    voice_prefix_gib: float = 0,
) -> None:
    """The token2wav of `templates` (CosyVoice2's or CosyVoice3's) as Triton model `name` (CPU, float32;
    `priority`: its first_chunk_priority; `voice_prefix_gib` where the template has it: CosyVoice2's)."""
    values = (
        f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32,cuda_graphs:auto,flow_compile:false,"
        f"stream_calls:true,instance_num:1,cuda_graph_batch_sizes:1\\,2,first_chunk_priority:{str(priority).lower()},"
        f"first_chunks_first:{first_chunks_first}"
    )
    if "${voice_prefix_gib}" in (templates / "token2wav" / "config.pbtxt").read_text():
        values += f",voice_prefix_gib:{voice_prefix_gib}"
    elif voice_prefix_gib:
        raise ValueError(f"the token2wav of {templates} has no voice_prefix_gib")
    install_template(templates, "token2wav", repo, name, values)


def install_llm_engine(
    repo: Path, name: str, llm_dir: Path, decoupled: bool, slots: int, priority: bool = False
) -> None:
    """The torch LLM engine of `llm_dir` as Triton model `name` (CPU, float32; `priority`: its
    first_chunk_priority)."""
    install_template(
        LLM_TEMPLATES,
        "tensorrt_llm_torch",
        repo,
        name,
        f"model_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},llm_max_batch_size:{slots},"
        "llm_max_seq_len:1024,llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false,llm_decode_attention:auto,llm_decode_linear:auto,llm_decode_pdl:auto,llm_stream_interval:auto,llm_output_tokens_from:<|s_0|>,"
        f"first_chunk_priority:{str(priority).lower()},audio_tokens_per_s:25,first_chunk_tokens:18",
    )


def bls_values(
    model_dir: Path,
    llm_dir: Path,
    decoupled: bool,
    llm: str,
    token2wav: str = "",
    strategy: str = CHUNK_STRATEGY,
    endpoint: str = "",
) -> str:
    """The `cosyvoice2` template's values for a BLS of this repository (`token2wav`: another token2wav model;
    `endpoint`: the `llm_endpoint`, with `llm` "none")."""
    leaves = {leaf: f"{PREFIX}{leaf}" for leaf in LEAVES} | ({"token2wav": token2wav} if token2wav else {})
    return (
        f"model_dir:{model_dir},llm_tokenizer_dir:{llm_dir},{COMMON},decoupled_mode:{decoupled},"
        f"bls_instance_num:1,token_hop_len:{TOKEN_HOP_LEN},pre_lookahead_len:{PRE_LOOKAHEAD_LEN},"
        f"dynamic_chunk_strategy:{strategy},max_new_tokens:{MAX_NEW_TOKENS},"
        f"max_text_length:{MAX_TEXT_LENGTH},text_normalization:false,max_reference_seconds:{MAX_REFERENCE_SECONDS},"
        + ",".join(f"{role}_model:{name}" for role, name in leaves.items())
        + f",tensorrt_llm_model:{'none' if endpoint else PREFIX + llm},llm_endpoint:{endpoint}"
    )


def install_text_inbox(repo: Path) -> None:
    """The `text_inbox` model as run.sh copies it (no template values; the name the BLS configs give)."""
    if not (repo / TEXT_INBOX).exists():
        shutil.copytree(
            TEMPLATES / TEXT_INBOX, repo / TEXT_INBOX, ignore=shutil.ignore_patterns("__pycache__")
        )


def install_template(templates: Path, template: str, repo: Path, name: str, values: str) -> Path:
    return install(template, repo, name, values, templates)


def tiny_prompter(folder: Path):
    """The CosyVoice2 prompt builder of a tiny synthetic LLM written under `folder`."""
    from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
    from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_cosyvoice2_llm

    llm_dir = write_cosyvoice2_llm(folder / "cosyvoice2_llm", "tiny", qwen2lm_state_dict(), 0)
    return CosyVoice2Prompt.from_llm_dir(Path(llm_dir))


def cached_voice_service(prompter, generate, token2wav, **options):
    """A CosyVoice2Service of `prompter` whose requests without a reference speak a cached voice (no front end)."""
    import numpy as np

    from tritontts.cosyvoice2.prompt import Decoding
    from tritontts.cosyvoice2.service import CosyVoice2Service, Voice

    return CosyVoice2Service(
        prompter,
        tokenize=None,
        embed=None,
        generate=generate,
        token2wav=token2wav,
        default_voice=Voice("cached text ", np.array([3, 1], dtype=np.int32)),
        sampling=prompter.sampling_params(Decoding(max_tokens=100)),
        **options,
    )
