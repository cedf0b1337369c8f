"""Doubles an FP32 tensor, echoes a string, and reports the numpy and Python the stub runs with."""

import json
import platform
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.triton.params import (
    RequestError,
    error_response,
    model_param,
    required_input,
    string_input,
    string_tensor,
)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.scale = model_param(config, "scale", float)
        self.upper = model_param(config, "upper", bool, default=False)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                x = required_input(pb_utils, request, "X", dtype=np.float32, ndim=1)
                if not np.all(np.isfinite(x)):
                    raise RequestError("X", "must be finite")
                text = string_input(pb_utils, request, "TEXT")
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("Y", (x * self.scale).astype(np.float32)),
                            string_tensor(pb_utils, "TEXT_OUT", text.upper() if self.upper else text),
                            string_tensor(pb_utils, "NUMPY_VERSION", np.__version__),
                            string_tensor(pb_utils, "PYTHON", [platform.python_version(), sys.prefix]),
                        ]
                    )
                )
            except Exception as err:
                responses.append(error_response(pb_utils, err))
        return responses
