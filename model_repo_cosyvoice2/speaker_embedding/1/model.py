"""CAMPPlus speaker embedding of each request's 16 kHz reference audio, FP16 [192] as upstream sends it.

A voice cache (content hash → embedding) spares repeated reference audios; hits and misses are Triton metrics.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits, check_waveform
from tritontts.cosyvoice2.frontend import CAMPPLUS_FILE, INPUT_SAMPLE_RATE, SpeakerEmbedder, onnx_device
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.instance_device import instance_device
from tritontts.triton.metrics import VoiceCacheCounters, release_metrics
from tritontts.triton.params import error_response, model_param, required_input
from tritontts.triton.stubs import end_stub_process
from tritontts.voice_cache import VoiceCache, audio_key


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        model_dir = model_param(config, "model_dir")
        device = instance_device(args, onnx_device(model_param(config, "device", default="auto")))
        self.embedder = SpeakerEmbedder(
            f"{model_dir}/{CAMPPLUS_FILE}",
            str(device),
            model_param(config, "onnx_threads", int, default=1),
        )
        self.limits = AudioLimits(
            max_seconds=model_param(config, "max_reference_seconds", float, default=30.0)
        )
        self.cache = VoiceCache(model_param(config, "voice_cache_size", int, default=1024))
        self.counters = VoiceCacheCounters(pb_utils, config["name"])

    def _embedding(self, request):
        wav = required_input(pb_utils, request, "reference_wav", dtype=np.float32)
        wav = check_waveform(wav, INPUT_SAMPLE_RATE, self.limits, "reference_wav")
        key = audio_key(wav, INPUT_SAMPLE_RATE, "cosyvoice2_campplus")
        embedding, hit = self.cache.get_or_compute(key, lambda: self.embedder(wav).astype(np.float16))
        self.counters.count(hit)
        return embedding

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tensor = pb_utils.Tensor("prompt_spk_embedding", self._embedding(request).reshape(1, -1))
                responses.append(pb_utils.InferenceResponse([tensor]))
            except Exception as err:
                responses.append(error_response(pb_utils, err))
        return responses

    def finalize(self):
        release_metrics(self.counters)
        end_stub_process()
