"""An OpenAI-compatible completions server over `LLMEngine`: the stand-in for TensorRT-LLM's `trtllm-serve`."""

from tritontts.llm.openai_server.app import create_app

__all__ = ["create_app"]
