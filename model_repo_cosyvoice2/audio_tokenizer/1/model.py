"""CosyVoice2 speech tokenizer: each request's reference audio → speech tokens + 151663 (upstream's ids).

A voice cache (content hash → tokens) spares repeated reference audios; hits and misses are Triton metrics.
The parameters `tokenizer_file` and `id_offset` (defaults: speech_tokenizer_v2.onnx, 151663) let CosyVoice3's
model repository serve this model with `speech_tokenizer_v3.onnx` and raw ids (offset 0), as its upstream does.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.cosyvoice2.frontend import (
    INPUT_SAMPLE_RATE,
    SPEECH_TOKENIZER_FILE,
    SpeechTokenizer,
    onnx_device,
)
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.spark.service import RequestLimits, check_reference_wav
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.instance_device import instance_device
from tritontts.triton.metrics import VoiceCacheCounters, release_metrics
from tritontts.triton.params import error_response, model_param, waveform_input
from tritontts.triton.stubs import end_stub_process
from tritontts.voice_cache import VoiceCache, audio_key


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        model_dir = model_param(config, "model_dir")
        tokenizer_file = model_param(config, "tokenizer_file", default=SPEECH_TOKENIZER_FILE)
        device = instance_device(args, onnx_device(model_param(config, "device", default="auto")))
        self.tokenizer = SpeechTokenizer(
            f"{model_dir}/{tokenizer_file}",
            str(device),
            model_param(config, "onnx_threads", int, default=1),
        )
        self.id_offset = model_param(config, "id_offset", int, default=ORIGINAL_VOCAB_SIZE)
        max_seconds = model_param(config, "max_reference_seconds", float, default=30.0)
        self.limits = RequestLimits(audio=AudioLimits(max_seconds=min(max_seconds, 30.0)))
        self.cache = VoiceCache(model_param(config, "voice_cache_size", int, default=1024))
        self.counters = VoiceCacheCounters(pb_utils, config["name"])

    def _tokens(self, request):
        wav = check_reference_wav(waveform_input(pb_utils, request), self.limits)
        key = audio_key(wav, INPUT_SAMPLE_RATE, "cosyvoice2_speech_tokens")
        tokens, hit = self.cache.get_or_compute(
            key, lambda: self.tokenizer(wav).astype(np.int32) + self.id_offset
        )
        self.counters.count(hit)
        return tokens

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = self._tokens(request)
                tensor = pb_utils.Tensor("prompt_speech_tokens", tokens.reshape(1, -1))
                responses.append(pb_utils.InferenceResponse([tensor]))
            except Exception as err:
                responses.append(error_response(pb_utils, err))
        return responses

    def finalize(self):
        release_metrics(self.counters)
        end_stub_process()
