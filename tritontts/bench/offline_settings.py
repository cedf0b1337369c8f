"""What a one-process benchmark run is asked to do: the models and backends it knows, its settings, the sampling
every backend uses, and the errors a backend raises. The bottom of the offline benchmark: it imports none of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritontts.devices import DTYPES

BACKENDS = ("torch", "hf", "trtllm", "openai")
BACKEND_ALIASES = {"trtllm-serve": "openai"}
CHAT_BACKEND_MODELS = ("cosyvoice2", "cosyvoice2_dit", "cosyvoice3")
"""the models whose LLM prompt the `openai` backend can send as chat messages"""
MODELS = ("spark_tts", "cosyvoice2", "cosyvoice2_dit", "cosyvoice3")
TOKEN2WAV_DTYPES = ("auto", *DTYPES)
MISSING_ENDPOINT = (
    "the openai backend needs --llm-endpoint URL, the /v1/chat/completions of an OpenAI-compatible LLM server "
    "(trtllm-serve, or python -m tritontts.llm.openai_server --model-dir <model-dir>/cosyvoice2_llm)"
)


class BackendUnavailable(RuntimeError):
    """The backend's library cannot be imported here, or its server cannot be reached."""


class LLMEndpointError(RuntimeError):
    """The LLM endpoint answered, but not with a completion."""


def backend_name(name: str) -> str:
    """The backend an alias stands for (`trtllm-serve` is `openai`)."""
    return BACKEND_ALIASES.get(name, name)


@dataclass(frozen=True)
class Decoding:
    """What every backend samples with, and the ids that end and pad a sequence."""

    end_id: int
    pad_id: int
    output_tokens_from: int | str = 0  # our engine's output window (a token or an id; run.sh's auto value)
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.0

    def sampling(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
        }


@dataclass(frozen=True)
class OfflineSettings:
    model_dir: Path
    backend: str = "torch"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    max_new_tokens: int | None = None
    """None: the model's default (1500 for Spark-TTS, 750 for CosyVoice2, as upstream)"""
    realistic_lengths: bool = False
    seed: int = 0
    max_seq_len: int | None = None
    engine_dir: Path | None = None
    model: str = "spark_tts"
    token2wav_dtype: str = "auto"
    """cosyvoice2 flow: auto (float16 on CUDA as upstream, float32 on CPU) | float32 | float16 | bfloat16"""
    llm_endpoint: str | None = None
    """openai: the URL of `/v1/chat/completions`"""
    llm_model: str = "trt_engines_bfloat16"
    """openai: the request's `model` (upstream's trtllm-serve name)"""
