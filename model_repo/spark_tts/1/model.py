"""Spark-TTS BLS: audio_tokenizer → tensorrt_llm → vocoder, whole utterances or streamed chunks.

Voices: a reference audio (upstream's inputs), a saved profile's tokens (`voice_global_tokens`,
`voice_semantic_tokens`: no audio_tokenizer call), or voice creation (`gender`, `pitch`, `speed`: upstream's
`process_prompt_control`). The request parameter `voice_profile: true` returns a reference's profile instead.

An instance runs one request at a time (see tritontts.triton.request_runner; parameter `max_concurrent_requests`);
concurrent requests go to other instances, and the models they call batch them.
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.spark.service import (
    RequestLimits,
    SparkPrompter,
    SparkTTSService,
    VoiceTokens,
    check_control,
    check_reference_wav,
    check_request,
    check_token_budget,
    check_voice_tokens,
)
from tritontts.streaming import ChunkSchedule
from tritontts.text.normalize import TextNormalizer, check_available
from tritontts.text.request import normalized_texts, wants_normalization
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.llm_contract import SamplingParams
from tritontts.triton.metrics import first_chunk_stage_seconds, release_metrics
from tritontts.triton.params import error_response, model_param, string_input, waveform_input
from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.stream_sender import serve_stream
from tritontts.triton.stub_objects import release_held
from tritontts.triton.stubs import callee_monitor, end_stub_process
from tritontts.triton.voice_profile_io import (
    CheckpointMarker,
    answer_profile,
    optional_row,
    optional_string,
    request_parameters,
    wants_profile,
)
from tritontts.voice_profile import VoiceProfile
from tritontts.voice_store import voice_store


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
        llm_dir = Path(model_param(config, "llm_tokenizer_dir"))
        self.prompter = SparkPrompter(llm_dir)
        # the audio_tokenizer reads BiCodec/ and wav2vec2 beside LLM/ (the checkpoint's layout)
        self.checkpoint = CheckpointMarker(llm_dir.parent, exclude=[llm_dir])
        cache_size = model_param(config, "voice_cache_size", int, default=256)
        self.service = SparkTTSService(
            self.prompter,
            self._tokenize_voice,
            self._generate,
            self._vocode,
            SamplingParams(max_tokens=self.max_new_tokens),
            schedule,
            limits,
            cache_size,
            voice_store(
                model_param(config, "voice_cache_dir", default="auto"),
                args["model_name"],
                VoiceTokens,
                cache_size,
            ),
        )
        self.limits = limits
        self.text_normalization = model_param(config, "text_normalization", bool, default=False)
        if self.text_normalization:
            check_available()  # the model fails to load, naming what is missing
        self.normalizer = TextNormalizer()
        self.models = {
            role: model_param(config, f"{role}_model", default=role)
            for role in ("audio_tokenizer", "tensorrt_llm", "vocoder")
        }
        self.first_chunks = first_chunk_stage_seconds(pb_utils, args["model_name"])
        self.runner = RequestRunner(model_param(config, "max_concurrent_requests", int, default=1))
        callee_monitor()  # its first read of /proc at load, not in the first request this instance serves

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

    def _vocode(self, global_tokens, semantic_tokens, first_chunk):
        inputs = {
            "global_tokens": global_tokens.reshape(1, -1).astype(np.int32),
            "semantic_tokens": semantic_tokens.reshape(1, -1).astype(np.int32),
            "first_chunk": np.full((1, 1), first_chunk, dtype=bool),
        }
        out = call_model(pb_utils, self.models["vocoder"], inputs, ["waveform"])
        return out["waveform"].reshape(-1)

    def _parse(self, request):
        has_wav = pb_utils.get_input_tensor_by_name(request, "reference_wav") is not None
        global_tokens = optional_row(pb_utils, request, "voice_global_tokens", np.int32)
        voice = None
        if global_tokens is not None:
            self.checkpoint.check(pb_utils, request)
            voice = check_voice_tokens(
                global_tokens, optional_row(pb_utils, request, "voice_semantic_tokens", np.int32)
            )
        parameters = request_parameters(request)
        checked = check_request(
            waveform_input(pb_utils, request) if has_wav else None,
            optional_string(pb_utils, request, "reference_text"),
            string_input(pb_utils, request, "target_text"),
            self.limits,
            check_token_budget(parameters, self.max_new_tokens),
            voice,
            check_control(*(optional_string(pb_utils, request, n) for n in ("gender", "pitch", "speed"))),
        )
        if wants_normalization(parameters, self.text_normalization):
            checked = normalized_texts(checked, self.normalizer)
        return checked

    def _profile(self, request):
        tokens = self.service.profile(check_reference_wav(waveform_input(pb_utils, request), self.limits))
        arrays = {"global_tokens": tokens.global_tokens, "semantic_tokens": tokens.semantic_tokens}
        return VoiceProfile("spark_tts", self.checkpoint.value, arrays)

    def _offline(self, request):
        try:
            if wants_profile(request_parameters(request)):
                return answer_profile(pb_utils, request, False, lambda: self._profile(request))
            audio = self.service.synthesize(self._parse(request))
            return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(pb_utils, err)

    def _stream(self, request):
        try:
            profile = wants_profile(request_parameters(request))
        except Exception:
            profile = False  # the stream below reports the bad parameter
        if profile:
            answer_profile(pb_utils, request, True, lambda: self._profile(request))
            return
        serve_stream(
            pb_utils, request, lambda: self.service.stream(self._parse(request), self.first_chunks.add)
        )

    def execute(self, requests):
        return self.runner.execute(requests, self.decoupled, self._stream, self._offline)

    def finalize(self):
        self.runner.close()
        release_metrics(self.first_chunks)
        release_held()
        end_stub_process()
