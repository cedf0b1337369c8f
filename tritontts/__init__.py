"""tritontts: LLM-based text-to-speech served on NVIDIA Triton Inference Server."""

__version__ = "0.1.0"
