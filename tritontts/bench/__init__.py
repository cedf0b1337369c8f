"""Benchmarking our Triton TTS models: datasets, request tensors, latency statistics and reports."""
