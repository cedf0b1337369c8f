"""Echoes X; installs the stack dumps every model of ours installs (tritontts.triton.debug)."""

import triton_python_backend_utils as pb_utils

from tritontts.triton.debug import enable_stack_dumps


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
