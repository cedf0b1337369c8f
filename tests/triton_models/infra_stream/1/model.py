"""Decoupled: streams COUNT responses (index, a small chunk, the text), then the final flag."""

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.triton.params import RequestError, error_response, required_input, string_input, string_tensor


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                count = int(required_input(pb_utils, request, "COUNT", dtype=np.int32).reshape(-1)[0])
                if count < 0:
                    raise RequestError("COUNT", f"must be >= 0, got {count}")
                text = string_input(pb_utils, request, "TEXT")
                for index in range(count):
                    chunk = np.arange(index + 1, dtype=np.float32) * 0.5
                    outputs = [
                        pb_utils.Tensor("INDEX", np.array([index], dtype=np.int32)),
                        pb_utils.Tensor("CHUNK", chunk),
                        string_tensor(pb_utils, "TEXT_OUT", f"{text}#{index}"),
                    ]
                    sender.send(pb_utils.InferenceResponse(outputs))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except Exception as err:
                sender.send(
                    error_response(pb_utils, err), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return None
