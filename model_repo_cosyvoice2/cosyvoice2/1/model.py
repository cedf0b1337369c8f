"""CosyVoice2 BLS: audio_tokenizer + speaker_embedding → tensorrt_llm → token2wav, whole or streamed.

With the optional parameter `llm_endpoint` (the URL of an OpenAI-compatible `/v1/chat/completions`, such as
trtllm-serve's) the LLM is reached over HTTP instead of the tensorrt_llm model (disaggregated serving).

Each request runs on a worker thread, so one instance serves many requests at once; the models it calls
batch them.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from uuid import uuid4

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.cosyvoice2.llm_http import ChatEndpoint, ChatSpeechClient
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, Decoding
from tritontts.cosyvoice2.service import CosyVoice2Service, Voice, check_request
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.spark.service import RequestLimits, check_token_budget
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.params import error_response, model_param, optional_input, string_input
from tritontts.triton.stream_sender import serve_stream

STRATEGIES = ("exponential", "fixed")


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        strategy = model_param(config, "dynamic_chunk_strategy", default="exponential")
        if strategy not in STRATEGIES:
            raise ValueError(f"dynamic_chunk_strategy must be one of {STRATEGIES}, got {strategy!r}")
        schedule = StreamSchedule(
            token_hop_len=model_param(config, "token_hop_len", int, default=15),
            pre_lookahead_len=model_param(config, "pre_lookahead_len", int, default=3),
            exponential=strategy == "exponential",
        )
        self.max_new_tokens = model_param(config, "max_new_tokens", int, default=750)
        self.limits = RequestLimits(
            max_text_length=model_param(config, "max_text_length", int, default=1000),
            audio=AudioLimits(max_seconds=model_param(config, "max_reference_seconds", float, default=30.0)),
        )
        self.models = {
            role: model_param(config, f"{role}_model", default=role)
            for role in ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm")
        }
        self.prompter = CosyVoice2Prompt.from_llm_dir(model_param(config, "llm_tokenizer_dir"))
        spk2info = Path(model_param(config, "model_dir")) / "spk2info.pt"
        endpoint = model_param(config, "llm_endpoint", default="")
        self.llm_http = ChatSpeechClient(ChatEndpoint(endpoint)) if endpoint else None
        default_voice = Voice.cached(load_spk2info(spk2info)[DEFAULT_SPEAKER]) if spk2info.exists() else None
        self.service = CosyVoice2Service(
            self.prompter,
            self._tokenize,
            self._embed,
            self._generate,
            self._token2wav,
            default_voice,
            self.prompter.sampling_params(Decoding(max_tokens=self.max_new_tokens)),
            schedule,
            self.limits,
            model_param(config, "voice_cache_size", int, default=256),
            generate_chat=None if self.llm_http is None else self.llm_http.generate,
        )
        self.pool = ThreadPoolExecutor(
            max_workers=model_param(config, "max_concurrent_requests", int, default=64)
        )

    def _tokenize(self, wav):
        out = call_model(
            pb_utils,
            self.models["audio_tokenizer"],
            reference_wav_arrays(wav),
            ["prompt_speech_tokens"],
        )
        return out["prompt_speech_tokens"].reshape(-1) - self.prompter.ids.speech_base

    def _embed(self, wav):
        out = call_model(
            pb_utils,
            self.models["speaker_embedding"],
            {"reference_wav": wav.reshape(1, -1)},
            ["prompt_spk_embedding"],
        )
        return out["prompt_spk_embedding"].reshape(-1)

    def _generate(self, prompt_ids, params, streaming):
        llm = self.models["tensorrt_llm"]
        return generate_tokens(
            pb_utils, llm, prompt_ids, params, params.end_id, params.pad_id, streaming, self.decoupled
        )

    def _token2wav(self, tokens, voice, token_offset, finalize, request_id):
        arrays = token2wav_arrays(
            tokens, voice.speech_tokens, voice.speech_feat, voice.embedding, token_offset, finalize
        )
        out = call_model(pb_utils, self.models["token2wav"], arrays, ["waveform"], request_id=request_id)
        return out["waveform"].reshape(-1)

    def _parse(self, request):
        wav = optional_input(pb_utils, request, "reference_wav")
        if wav is not None:
            length = optional_input(pb_utils, request, "reference_wav_len", dtype=np.int32)
            wav = wav.reshape(-1) if length is None else wav.reshape(-1)[: int(length.reshape(-1)[0])]
        reference_text = optional_input(pb_utils, request, "reference_text")
        return check_request(
            wav,
            None if reference_text is None else string_input(pb_utils, request, "reference_text"),
            string_input(pb_utils, request, "target_text"),
            self.limits,
            check_token_budget(json.loads(request.parameters() or "{}"), self.max_new_tokens),
        )

    def _offline(self, request):
        try:
            audio = self.service.synthesize(self._parse(request), request.request_id() or uuid4().hex)
            return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(pb_utils, err)

    def _stream(self, request):
        serve_stream(pb_utils, request, lambda: self.service.stream(self._parse(request), uuid4().hex))

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                self.pool.submit(self._stream, request)
            return None
        return list(self.pool.map(self._offline, requests))

    def finalize(self):
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.llm_http is not None:
            self.llm_http.close()
