"""BiCodec audio tokenizer: the reference audios of all requests not in the voice cache, in one batch.

The voice cache (content hash → tokens, bounded LRU) is shared by every BLS instance that calls this model;
its hits and misses are Triton metrics (`tritontts_voice_cache_hits_total`, `..._misses_total`).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.spark.codec import SparkCodec
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
        device = instance_device(args, model_param(config, "device", default="auto"))
        # tokenizes only: no detokenize graphs
        self.codec = SparkCodec(model_param(config, "model_dir"), device, cuda_graphs=False)
        max_seconds = model_param(config, "max_reference_seconds", float, default=30.0)
        self.limits = RequestLimits(audio=AudioLimits(max_seconds=max_seconds))
        self.codec.warm_tokenizer(max_seconds)
        self.cache = VoiceCache(model_param(config, "voice_cache_size", int, default=1024))
        self.counters = VoiceCacheCounters(pb_utils, config["name"])

    def _reference(self, request):
        return check_reference_wav(waveform_input(pb_utils, request), self.limits)

    def execute(self, requests):
        voices, wavs, keys, slots = [None] * len(requests), [], [], []
        for i, request in enumerate(requests):
            try:
                wav = self._reference(request)
                key = audio_key(wav, self.codec.sample_rate, "spark_tts")
                voices[i] = self.cache.get(key)
                if voices[i] is None:
                    wavs.append(wav)
                    keys.append(key)
                    slots.append(i)
            except Exception as err:
                voices[i] = err
        self.counters.count(True, len(requests) - len(slots) - sum(isinstance(v, Exception) for v in voices))
        self.counters.count(False, len(slots))
        try:
            computed = self.codec.tokenize(wavs) if wavs else []
        except Exception as err:
            computed = [err] * len(wavs)
        for i, key, voice in zip(slots, keys, computed):
            voices[i] = voice
            if not isinstance(voice, Exception):
                self.cache.put(key, voice)
        responses = []
        for voice in voices:
            if isinstance(voice, Exception):
                responses.append(error_response(pb_utils, voice))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("global_tokens", voice.global_tokens.reshape(1, -1).astype(np.int32)),
                        pb_utils.Tensor(
                            "semantic_tokens", voice.semantic_tokens.reshape(1, -1).astype(np.int32)
                        ),
                    ]
                )
            )
        return responses

    def finalize(self):
        release_metrics(self.counters)
        end_stub_process()
