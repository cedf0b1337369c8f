"""CosyVoice3 vocoder: mel → 24 kHz audio with the causal HiFT (fp32), one request at a time, stateless.

The work is in tritontts.cosyvoice3.hift (the model) and tritontts.cosyvoice3.wire (the inputs). On a GPU the
calls of a mel length seen before replay CUDA graphs, and the lengths of a stream's first chunks are captured
before serving."""

import json

import torch
import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice2.warmup import streamed_mel_lengths, warm_up_vocoder
from tritontts.cosyvoice3.hift import load_causal_hift
from tritontts.cosyvoice3.wire import parse_vocoder_inputs
from tritontts.cuda_graphs import graphs_wanted
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.instance_device import instance_device
from tritontts.triton.params import error_response, model_param, optional_input
from tritontts.triton.stubs import end_stub_process


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        self.device = instance_device(args, model_param(config, "device", default="auto"))
        max_seconds = model_param(config, "max_seconds", float, default=300.0)
        self.hift = load_causal_hift(
            model_param(config, "model_dir"), device=self.device, max_seconds=max_seconds
        )
        if graphs_wanted(model_param(config, "cuda_graphs", default="auto"), self.device):
            self.hift.use_cuda_graphs()
        if self.device.type == "cuda":
            with torch.inference_mode():
                warm_up_vocoder(
                    lambda mel: self.hift.inference(mel.to(self.device), False), streamed_mel_lengths()
                )

    def _speech(self, request):
        mel, finalize = parse_vocoder_inputs(
            optional_input(pb_utils, request, "mel"),
            optional_input(pb_utils, request, "finalize"),
            self.hift.lookahead_frames,
        )
        with torch.inference_mode():
            speech, _ = self.hift.inference(mel.to(self.device), finalize)
        return speech.float().cpu().numpy().reshape(1, -1)

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                speech = self._speech(request)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("tts_speech", speech)]))
            except Exception as err:
                responses.append(error_response(pb_utils, err))
        return responses

    def finalize(self):
        end_stub_process()
