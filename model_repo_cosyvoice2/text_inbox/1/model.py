"""text_inbox: pushes text deltas to a running bistream request of the CosyVoice BLS on this server (see
tritontts.triton.text_inbox and docs/streaming-text.md, "Bistream")."""

import triton_python_backend_utils as pb_utils

from tritontts.triton.stubs import end_stub_process
from tritontts.triton.text_inbox import TextInboxModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = TextInboxModel(pb_utils)

    def execute(self, requests):
        return self.model.execute(requests)

    def finalize(self):
        end_stub_process()
