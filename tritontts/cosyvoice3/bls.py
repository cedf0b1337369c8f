"""The CosyVoice3 BLS under Triton (upstream's `model_repo_cosyvoice3/cosyvoice3`): audio_tokenizer +
speaker_embedding → LLM → token2wav (mel) → vocoder, whole or streamed.

The LLM is, with the parameter `llm_api_base` (the URL of an OpenAI-compatible `/v1/chat/completions`, as
upstream's trtllm-serve or `python -m tritontts.llm.openai_server`), that server, asked with upstream's payload;
without it, the `tensorrt_llm`-contract model of the same server. The pipeline is CosyVoice2's service
(`CosyVoice2Service`: voice cache, cached speaker, chunk schedule, first-chunk stages) with CosyVoice3's prompt
and prompt mel; the vocoder is stateless like upstream's, so a stream's accumulated mel lives here and each
chunk re-vocodes it and sends the new samples.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from tritontts.audio import AudioLimits
from tritontts.cosyvoice2.llm_http import ChatEndpoint, ChatSpeechClient
from tritontts.cosyvoice2.prompt import Decoding
from tritontts.cosyvoice2.service import CosyVoice2Request, CosyVoice2Service, Voice, check_request
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, SPK2INFO_FILE, load_spk2info
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.cosyvoice3.config import load_cosyvoice3_config
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt, with_system_prompt
from tritontts.cosyvoice3.wire import token2wav_arrays, vocoder_arrays
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.service import RequestLimits, check_reference_wav, check_text, check_token_budget
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.metrics import StageSeconds
from tritontts.triton.params import error_response, model_param, optional_input, string_input
from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.stream_sender import serve_stream

STRATEGIES = ("exponential", "fixed")
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder", "tensorrt_llm")


@dataclass
class _Stream:
    mels: list[np.ndarray] = field(default_factory=list)
    sent: int = 0


class CosyVoice3Bls:
    def __init__(self, pb_utils: Any, args: dict[str, Any]) -> None:
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        strategy = model_param(config, "dynamic_chunk_strategy", default="exponential")
        if strategy not in STRATEGIES:
            raise ValueError(
                f"dynamic_chunk_strategy must be one of {STRATEGIES}, got {strategy!r} (upstream's time_based "
                "is not implemented)"
            )
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
        self.models = {role: model_param(config, f"{role}_model", default=role) for role in LEAVES}
        self.prompter = CosyVoice3Prompt.from_llm_dir(model_param(config, "llm_tokenizer_dir"))
        model_dir = Path(model_param(config, "model_dir"))
        endpoint = model_param(config, "llm_api_base", default="")
        self.llm_http = ChatSpeechClient(ChatEndpoint(endpoint)) if endpoint else None
        self.service = CosyVoice2Service(
            self.prompter,  # type: ignore[arg-type]  (CosyVoice2Prompt's interface)
            self._tokenize,
            self._embed,
            self._generate,
            self._token2wav,
            _default_voice(model_dir / SPK2INFO_FILE),
            self.prompter.sampling_params(Decoding(max_tokens=self.max_new_tokens)),
            schedule,
            self.limits,
            model_param(config, "voice_cache_size", int, default=256),
            generate_chat=None if self.llm_http is None else self._generate_chat,
            prompt_mel=load_cosyvoice3_config(model_dir).prompt_mel,
        )
        self.first_chunks = StageSeconds(
            pb_utils,
            args["model_name"],
            "tritontts_first_chunk_seconds_total",
            "tritontts_first_chunks_total",
            "streams' first chunks in the BLS",
        )
        self.streams: dict[str, _Stream] = {}
        self.lock = threading.Lock()
        self.runner = RequestRunner(model_param(config, "max_concurrent_requests", int, default=1))

    def _tokenize(self, wav: np.ndarray) -> np.ndarray:
        out = call_model(
            self.pb, self.models["audio_tokenizer"], reference_wav_arrays(wav), ["prompt_speech_tokens"]
        )
        return out["prompt_speech_tokens"].reshape(-1)

    def _embed(self, wav: np.ndarray) -> np.ndarray:
        model = self.models["speaker_embedding"]
        out = call_model(self.pb, model, {"reference_wav": wav.reshape(1, -1)}, ["prompt_spk_embedding"])
        return out["prompt_spk_embedding"].reshape(-1)

    def _generate(self, prompt_ids: np.ndarray, params: Any, streaming: bool) -> Iterator[np.ndarray]:
        return generate_tokens(
            self.pb, self.models["tensorrt_llm"], prompt_ids, params, params.end_id, params.pad_id, streaming,
            self.decoupled,
        )  # fmt: skip

    def _generate_chat(
        self,
        reference_text: str,
        target_text: str,
        speech: np.ndarray,
        params: SamplingParams,
        streaming: bool,
    ) -> Iterator[np.ndarray]:
        """Upstream's chat request (the system part prefixed as its BLS does); `<|s_N|>` → this LLM's ids."""
        assert self.llm_http is not None
        pieces = self.llm_http.generate(
            with_system_prompt(reference_text), target_text, speech, params, streaming
        )
        shift = self.prompter.ids.speech_base - ORIGINAL_VOCAB_SIZE
        try:
            for ids in pieces:
                yield ids + shift
        finally:
            pieces.close()

    def _mel(
        self, tokens: np.ndarray, voice: Voice, offset: int | None, finalize: bool | None, rid: str
    ) -> np.ndarray:
        arrays = token2wav_arrays(
            tokens, voice.speech_tokens, voice.speech_feat, voice.embedding, offset, finalize
        )
        if voice.speech_feat is None:  # the deployment's cached speaker: token2wav has its own copy
            arrays = {k: v for k, v in arrays.items() if not k.startswith("prompt_")}
        out = call_model(self.pb, self.models["token2wav"], arrays, ["mel"], request_id=rid)
        return out["mel"].reshape(80, -1)

    def _vocode(self, mel: np.ndarray, finalize: bool) -> np.ndarray:
        out = call_model(self.pb, self.models["vocoder"], vocoder_arrays(mel, finalize), ["tts_speech"])
        return out["tts_speech"].reshape(-1)

    def _token2wav(
        self, tokens: np.ndarray, voice: Voice, offset: int | None, finalize: bool | None, stream_id: str
    ) -> np.ndarray:
        if offset is None:
            return self._vocode(self._mel(tokens, voice, None, None, stream_id), True)
        mel = self._mel(tokens, voice, offset, bool(finalize), stream_id)
        with self.lock:
            state = self.streams.setdefault(stream_id, _Stream())
        state.mels.append(mel)
        speech = self._vocode(np.concatenate(state.mels, axis=1), bool(finalize))
        new = speech[state.sent :]
        state.sent += new.size
        if finalize:
            self._forget(stream_id)
        return new

    def _forget(self, stream_id: str) -> None:
        with self.lock:
            self.streams.pop(stream_id, None)

    def _parse(self, request: Any) -> CosyVoice2Request:
        pb = self.pb
        wav = optional_input(pb, request, "reference_wav")
        if wav is not None:
            length = optional_input(pb, request, "reference_wav_len", dtype=np.int32)
            wav = wav.reshape(-1) if length is None else wav.reshape(-1)[: int(length.reshape(-1)[0])]
        reference_text = optional_input(pb, request, "reference_text")
        text = None if reference_text is None else string_input(pb, request, "reference_text")
        target = string_input(pb, request, "target_text")
        budget = check_token_budget(json.loads(request.parameters() or "{}"), self.max_new_tokens)
        if (
            wav is not None and text is None
        ):  # upstream: reference_text is optional, the system part stands alone
            target = check_text(target, "target_text", self.limits)
            return CosyVoice2Request(check_reference_wav(wav, self.limits), "", target, budget)
        return check_request(wav, text, target, self.limits, budget)

    def _offline(self, request: Any) -> Any:
        try:
            audio = self.service.synthesize(self._parse(request), request.request_id() or uuid4().hex)
            return self.pb.InferenceResponse([self.pb.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(self.pb, err)

    def _chunks(self, request: Any) -> Iterator[np.ndarray]:
        stream_id = uuid4().hex
        try:
            yield from self.service.stream(self._parse(request), stream_id, self.first_chunks.add)
        finally:
            self._forget(stream_id)

    def _stream(self, request: Any) -> None:
        serve_stream(self.pb, request, lambda: self._chunks(request))

    def execute(self, requests: list[Any]) -> list[Any] | None:
        return self.runner.execute(requests, self.decoupled, self._stream, self._offline)

    def close(self) -> None:
        self.runner.close()
        if self.llm_http is not None:
            self.llm_http.close()


def _default_voice(spk2info: Path) -> Voice | None:
    return Voice.cached(load_spk2info(spk2info)[DEFAULT_SPEAKER]) if spk2info.exists() else None
