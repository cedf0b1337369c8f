"""A small PyTorch engine for Qwen2-based TTS LLMs: static KV cache, in-flight batching, CUDA graphs.

The engine is `tritontts.llm.engine.LLMEngine`; `tritontts.llm.sequence` (what a request asks for and gets back)
imports no torch, so a BLS that only speaks the engine's contract loads without it."""
