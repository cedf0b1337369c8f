"""Spark-TTS BLS: audio_tokenizer → tensorrt_llm → vocoder, whole utterances or streamed chunks.

An instance runs one request at a time (see tritontts.triton.request_runner; parameter `max_concurrent_requests`);
concurrent requests go to other instances, and the models they call batch them.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.spark.service import (
    RequestLimits,
    SparkPrompter,
    SparkTTSService,
    VoiceTokens,
    check_request,
    check_token_budget,
)
from tritontts.streaming import ChunkSchedule
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.llm_contract import SamplingParams
from tritontts.triton.params import error_response, model_param, string_input, waveform_input
from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.stream_sender import serve_stream


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        frame_rate = model_param(config, "audio_tokenizer_frame_rate", float, default=50.0)
        schedule = ChunkSchedule.from_durations(
            model_param(config, "audio_chunk_duration", float),
            model_param(config, "max_audio_chunk_duration", float),
            model_param(config, "audio_chunk_size_scale_factor", float),
            model_param(config, "audio_chunk_overlap_duration", float),
            frame_rate,
        )
        limits = RequestLimits(
            max_text_length=model_param(config, "max_text_length", int, default=1000),
            audio=AudioLimits(max_seconds=model_param(config, "max_reference_seconds", float, default=30.0)),
        )
        self.max_new_tokens = model_param(config, "max_new_tokens", int, default=1500)
        self.prompter = SparkPrompter(model_param(config, "llm_tokenizer_dir"))
        self.service = SparkTTSService(
            self.prompter,
            self._tokenize_voice,
            self._generate,
            self._vocode,
            SamplingParams(max_tokens=self.max_new_tokens),
            schedule,
            limits,
            model_param(config, "voice_cache_size", int, default=256),
        )
        self.limits = limits
        self.models = {
            role: model_param(config, f"{role}_model", default=role)
            for role in ("audio_tokenizer", "tensorrt_llm", "vocoder")
        }
        self.runner = RequestRunner(model_param(config, "max_concurrent_requests", int, default=1))

    def _tokenize_voice(self, wav):
        out = call_model(
            pb_utils,
            self.models["audio_tokenizer"],
            reference_wav_arrays(wav),
            ["global_tokens", "semantic_tokens"],
        )
        return VoiceTokens(out["global_tokens"].reshape(-1), out["semantic_tokens"].reshape(-1))

    def _generate(self, prompt_ids, params, streaming):
        llm = self.models["tensorrt_llm"]
        return generate_tokens(
            pb_utils,
            llm,
            prompt_ids,
            params,
            self.prompter.end_id,
            self.prompter.pad_id,
            streaming,
            self.decoupled,
        )

    def _vocode(self, global_tokens, semantic_tokens):
        out = call_model(
            pb_utils,
            self.models["vocoder"],
            {
                "global_tokens": global_tokens.reshape(1, -1).astype(np.int32),
                "semantic_tokens": semantic_tokens.reshape(1, -1).astype(np.int32),
            },
            ["waveform"],
        )
        return out["waveform"].reshape(-1)

    def _parse(self, request):
        return check_request(
            waveform_input(pb_utils, request),
            string_input(pb_utils, request, "reference_text"),
            string_input(pb_utils, request, "target_text"),
            self.limits,
            check_token_budget(json.loads(request.parameters() or "{}"), self.max_new_tokens),
        )

    def _offline(self, request):
        try:
            audio = self.service.synthesize(self._parse(request))
            return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(pb_utils, err)

    def _stream(self, request):
        serve_stream(pb_utils, request, lambda: self.service.stream(self._parse(request)))

    def execute(self, requests):
        return self.runner.execute(requests, self.decoupled, self._stream, self._offline)

    def finalize(self):
        self.runner.close()
