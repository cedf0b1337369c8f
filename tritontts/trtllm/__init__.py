"""The TensorRT-LLM path: HF Qwen2 -> TensorRT-LLM checkpoint (`convert`) -> `trtllm-build` engine (`build`).

Import the submodules directly; `python -m tritontts.trtllm.build` runs the build.
"""
