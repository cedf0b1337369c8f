"""CosyVoice2 BLS: audio_tokenizer + speaker_embedding → tensorrt_llm (or `llm_endpoint`) → token2wav.

An instance runs one request at a time (parameter `max_concurrent_requests`); concurrent requests go to other
instances, and the models they call batch them. The work is in tritontts.triton.cosyvoice2_bls.
"""

import triton_python_backend_utils as pb_utils

from tritontts.triton.cosyvoice2_bls import CosyVoice2Bls
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.stubs import end_stub_process


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        self.bls = CosyVoice2Bls(pb_utils, args)

    def execute(self, requests):
        return self.bls.execute(requests)

    def finalize(self):
        self.bls.close()
        end_stub_process()
