"""The CosyVoice2 BLS under Triton: audio_tokenizer (+ speaker_embedding) → LLM → token2wav, whole or streamed.

One class serves both Triton models of the family: `cosyvoice2` (token2wav = flow + HiFT, prompt features made
here) and `cosyvoice2_dit` (token2wav_dit, which takes the reference audio and makes its own prompt, as
upstream's). The LLM is the server's `tensorrt_llm` model, or, with the parameter `llm_endpoint` (the URL of an
OpenAI-compatible `/v1/chat/completions`, such as trtllm-serve's), an LLM server elsewhere (disaggregated
serving).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from tritontts.audio import AudioLimits
from tritontts.cosyvoice2.llm_http import ChatEndpoint, ChatSpeechClient
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, Decoding
from tritontts.cosyvoice2.service import CosyVoice2Request, CosyVoice2Service, Voice, check_request
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.dit_token2wav.wire import dit_token2wav_arrays
from tritontts.spark.service import RequestLimits, check_token_budget
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.metrics import StageSeconds
from tritontts.triton.params import error_response, model_param, optional_input, string_input
from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.sequence import call_flags
from tritontts.triton.stream_sender import serve_stream

STRATEGIES = ("exponential", "fixed")
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm")


class CosyVoice2Bls:
    def __init__(self, pb_utils: Any, args: dict[str, Any], dit: bool = False) -> None:
        self.pb = pb_utils
        self.dit = dit
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
        defaults = {role: role for role in LEAVES} | ({"token2wav": "token2wav_dit"} if dit else {})
        self.models = {role: model_param(config, f"{role}_model", default=defaults[role]) for role in LEAVES}
        self.prompter = CosyVoice2Prompt.from_llm_dir(model_param(config, "llm_tokenizer_dir"))
        endpoint = model_param(config, "llm_endpoint", default="")
        self.llm_http = ChatSpeechClient(ChatEndpoint(endpoint)) if endpoint else None
        self.service = CosyVoice2Service(
            self.prompter,
            self._tokenize,
            self._embed,
            self._generate,
            self._token2wav_dit if dit else self._token2wav,
            None if dit else _default_voice(Path(model_param(config, "model_dir")) / "spk2info.pt"),
            self.prompter.sampling_params(Decoding(max_tokens=self.max_new_tokens)),
            schedule,
            self.limits,
            model_param(config, "voice_cache_size", int, default=256),
            generate_chat=None if self.llm_http is None else self.llm_http.generate,
            flow_prompt=not dit,
        )
        self.first_chunks = StageSeconds(
            pb_utils,
            args["model_name"],
            "tritontts_first_chunk_seconds_total",
            "tritontts_first_chunks_total",
            "streams' first chunks in the BLS",
        )
        self.runner = RequestRunner(model_param(config, "max_concurrent_requests", int, default=1))

    def _tokenize(self, wav: np.ndarray) -> np.ndarray:
        model = self.models["audio_tokenizer"]
        out = call_model(self.pb, model, reference_wav_arrays(wav), ["prompt_speech_tokens"])
        return out["prompt_speech_tokens"].reshape(-1) - self.prompter.ids.speech_base

    def _embed(self, wav: np.ndarray) -> np.ndarray:
        model = self.models["speaker_embedding"]
        out = call_model(self.pb, model, {"reference_wav": wav.reshape(1, -1)}, ["prompt_spk_embedding"])
        return out["prompt_spk_embedding"].reshape(-1)

    def _generate(self, prompt_ids: np.ndarray, params: Any, streaming: bool) -> Any:
        llm = self.models["tensorrt_llm"]
        return generate_tokens(
            self.pb, llm, prompt_ids, params, params.end_id, params.pad_id, streaming, self.decoupled
        )

    def _call_token2wav(
        self, arrays: dict[str, np.ndarray], request_id: str, token_offset: int | None, finalize: bool | None
    ) -> np.ndarray:
        flags = call_flags(token_offset, finalize)
        out = call_model(self.pb, self.models["token2wav"], arrays, ["waveform"], request_id, flags)
        return out["waveform"].reshape(-1)

    def _token2wav(
        self,
        tokens: np.ndarray,
        voice: Voice,
        token_offset: int | None,
        finalize: bool | None,
        request_id: str,
    ) -> np.ndarray:
        arrays = token2wav_arrays(
            tokens, voice.speech_tokens, voice.speech_feat, voice.embedding, token_offset, finalize
        )
        return self._call_token2wav(arrays, request_id, token_offset, finalize)

    def _token2wav_dit(
        self,
        tokens: np.ndarray,
        voice: Voice,
        token_offset: int | None,
        finalize: bool | None,
        request_id: str,
    ) -> np.ndarray:
        chunk = tokens if token_offset is None else tokens[token_offset:]
        arrays = dit_token2wav_arrays(chunk, voice.reference_wav, finalize)
        return self._call_token2wav(arrays, request_id, token_offset, finalize)

    def _parse(self, request: Any) -> CosyVoice2Request:
        pb = self.pb
        wav = optional_input(pb, request, "reference_wav")
        if wav is not None:
            length = optional_input(pb, request, "reference_wav_len", dtype=np.int32)
            wav = wav.reshape(-1) if length is None else wav.reshape(-1)[: int(length.reshape(-1)[0])]
        reference_text = optional_input(pb, request, "reference_text")
        return check_request(
            wav,
            None if reference_text is None else string_input(pb, request, "reference_text"),
            string_input(pb, request, "target_text"),
            self.limits,
            check_token_budget(json.loads(request.parameters() or "{}"), self.max_new_tokens),
        )

    def _offline(self, request: Any) -> Any:
        try:
            audio = self.service.synthesize(self._parse(request), request.request_id() or uuid4().hex)
            return self.pb.InferenceResponse([self.pb.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(self.pb, err)

    def _stream(self, request: Any) -> None:
        serve_stream(
            self.pb,
            request,
            lambda: self.service.stream(self._parse(request), uuid4().hex, self.first_chunks.add),
        )

    def execute(self, requests: list[Any]) -> list[Any] | None:
        return self.runner.execute(requests, self.decoupled, self._stream, self._offline)

    def close(self) -> None:
        self.runner.close()
        if self.llm_http is not None:
            self.llm_http.close()


def _default_voice(spk2info: Path) -> Voice | None:
    return Voice.cached(load_spk2info(spk2info)[DEFAULT_SPEAKER]) if spk2info.exists() else None
