"""A small PyTorch engine for Qwen2-based TTS LLMs: static KV cache, in-flight batching, CUDA graphs."""

from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import FinishReason, SamplingParams, TokenEvent

__all__ = ["FinishReason", "LLMEngine", "SamplingParams", "TokenEvent"]
