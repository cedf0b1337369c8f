"""CosyVoice3 BLS: audio_tokenizer + speaker_embedding → LLM (tensorrt_llm, or `llm_api_base` over HTTP) →
token2wav (mel) → vocoder. The work is in tritontts.cosyvoice3.bls."""

import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice3.bls import CosyVoice3Bls
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.stubs import end_stub_process


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        self.bls = CosyVoice3Bls(pb_utils, args)

    def execute(self, requests):
        return self.bls.execute(requests)

    def finalize(self):
        self.bls.close()
        end_stub_process()
