"""The CosyVoice2 BLS under Triton: audio_tokenizer (+ speaker_embedding) → LLM → token2wav, whole or streamed.

One class serves both Triton models of the family: `cosyvoice2` (token2wav = flow + HiFT, prompt features made
here) and `cosyvoice2_dit` (token2wav_dit, which takes the reference audio and makes its own prompt, as
upstream's). The LLM is the server's `tensorrt_llm` model, or, with the parameter `llm_endpoint` (the URL of an
OpenAI-compatible `/v1/chat/completions`, such as trtllm-serve's), an LLM server elsewhere (disaggregated
serving); bistream requests then go to that server's `/v1/completions` (token-id prompts).

Beyond upstream's inputs: the request parameter `mode` (zero_shot, cross_lingual, instruct2) with the input
`instruct_text`; a saved voice's profile (`voice_speech_tokens`, and for the flow `voice_speech_feat`,
`voice_spk_embedding`; `voice_checkpoint`) that spares the audio_tokenizer and speaker_embedding calls; and the
parameter `voice_profile: true`, which answers with a reference's profile instead of audio.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from tritontts.audio import AudioLimits
from tritontts.cosyvoice2.bistream import BistreamTokens
from tritontts.cosyvoice2.llm_http import ChatEndpoint, ChatSpeechClient
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, Decoding
from tritontts.cosyvoice2.request import (
    CosyVoice2Request,
    ProfileInputs,
    Voice,
    check_mode,
    check_profile,
    check_request,
)
from tritontts.cosyvoice2.service import CosyVoice2Service
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.dit_token2wav.wire import dit_token2wav_arrays
from tritontts.spark.service import RequestLimits, check_reference_wav, check_token_budget
from tritontts.text.normalize import TextNormalizer, check_available
from tritontts.text.request import normalized_texts, wants_normalization
from tritontts.triton.bls import call_model, generate_tokens, reference_wav_arrays
from tritontts.triton.metrics import first_chunk_stage_seconds, release_metrics
from tritontts.triton.params import RequestError, error_response, model_param, optional_input, string_input
from tritontts.triton.request_runner import RequestRunner
from tritontts.triton.sequence import call_flags
from tritontts.triton.stream_sender import serve_stream
from tritontts.triton.stub_objects import release_held
from tritontts.triton.stubs import callee_monitor
from tritontts.triton.text_inbox import open_inbox
from tritontts.triton.voice_profile_io import (
    CheckpointMarker,
    answer_profile,
    optional_row,
    optional_string,
    request_parameters,
    wants_profile,
)
from tritontts.voice_profile import KIND_ARRAYS, VoiceProfile
from tritontts.voice_store import voice_store

log = logging.getLogger(__name__)

LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm")


BISTREAM_PARAMETER = "bistream_session"


def checked_length(deltas: Iterator[str], first: str, limits: RequestLimits) -> Iterator[str]:
    """The deltas, failing (naming `text`) once the session's text passes the BLS's `max_text_length`."""
    total = len(first)
    for delta in deltas:
        total += len(delta)
        if total > limits.max_text_length:
            raise RequestError(
                "text", f"the session's text passed {limits.max_text_length} characters (max_text_length)"
            )
        yield delta


def idle_seconds(value: Any) -> float:
    """The request parameter `bistream_idle_timeout_s` (a number, or a string of one) as seconds > 0."""
    try:
        seconds = float(value) if not isinstance(value, bool) else -1.0
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise RequestError("bistream_idle_timeout_s", f"must be a number of seconds > 0, got {value!r}")
    return seconds


class CosyVoiceBlsBase:
    """What the CosyVoice2 and CosyVoice3 BLS share: the model parameters both read, the leaf calls both make
    (speaker embedding, LLM), the request's reference audio, its voice mode and profile inputs, the
    `voice_profile` answer, and Triton's execute/close."""

    pb: Any
    decoupled: bool
    models: dict[str, str]
    llm_http: ChatSpeechClient | None
    runner: RequestRunner
    service: CosyVoice2Service
    checkpoint: CheckpointMarker
    profile_kind: str
    """tritontts.voice_profile's kind of this BLS's profiles"""
    dit: bool = False
    """token2wav makes its own prompt from the reference audio (CosyVoice2-DiT)"""
    transcript_optional: bool = False
    """a zero-shot reference may come without its transcript (CosyVoice3: the system part stands alone)"""
    bistream_tokens: BistreamTokens | None = None
    """the LLM ids of bistream requests (request parameter `bistream_session`); None: this BLS takes none"""

    def _read_settings(self, pb_utils: Any, args: dict[str, Any], leaves: dict[str, str]) -> dict[str, Any]:
        """Sets pb, decoupled, schedule, max_new_tokens, limits, models (role → Triton model, `leaves` giving
        the defaults) and voice_cache_size; returns the model config for the rest."""
        self.pb = pb_utils
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.schedule = StreamSchedule.from_strategy(
            model_param(config, "dynamic_chunk_strategy", default="exponential"),
            token_hop_len=model_param(config, "token_hop_len", int, default=15),
            pre_lookahead_len=model_param(config, "pre_lookahead_len", int, default=3),
        )
        self.max_new_tokens = model_param(config, "max_new_tokens", int, default=750)
        self.limits = RequestLimits(
            max_text_length=model_param(config, "max_text_length", int, default=1000),
            audio=AudioLimits(max_seconds=model_param(config, "max_reference_seconds", float, default=30.0)),
        )
        self.models = {
            role: model_param(config, f"{role}_model", default=name) for role, name in leaves.items()
        }
        self.voice_cache_size = model_param(config, "voice_cache_size", int, default=256)
        self.bistream_idle_timeout_s = model_param(config, "bistream_idle_timeout_s", float, default=30.0)
        self.text_normalization = model_param(config, "text_normalization", bool, default=False)
        if self.text_normalization:
            check_available()  # the model fails to load, naming what is missing
        self.normalizer = TextNormalizer()
        self.voice_store = voice_store(
            model_param(config, "voice_cache_dir", default="auto"),
            args["model_name"],
            Voice,
            self.voice_cache_size,
        )
        return config

    def _start(self, pb_utils: Any, args: dict[str, Any], config: dict[str, Any]) -> None:
        """The last step of __init__, once everything else is built: the first-chunk metric and the runner
        (the order both BLS had before they shared this code)."""
        self.first_chunks = first_chunk_stage_seconds(pb_utils, args["model_name"])
        self.runner = RequestRunner(model_param(config, "max_concurrent_requests", int, default=1))

    def _embed(self, wav: np.ndarray) -> np.ndarray:
        model = self.models["speaker_embedding"]
        out = call_model(self.pb, model, {"reference_wav": wav.reshape(1, -1)}, ["prompt_spk_embedding"])
        return out["prompt_spk_embedding"].reshape(-1)

    def _complete(self, prompt_ids: list[int], params: Any) -> Iterator[int]:
        """A bistream segment over the LLM server's `/v1/completions` (the service's `complete`)."""
        assert self.llm_http is not None
        stop = self.prompter.tokenizer.id_to_token(params.end_id)
        if stop is None:
            raise RuntimeError(f"bistream: the LLM tokenizer has no token {params.end_id}")
        return self.llm_http.complete(prompt_ids, params, stop, self.prompter.ids.speech_base)

    def _streamed(self, stream_id: str, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """A stream's audio chunks (`stream_id`: its token2wav stream); CosyVoice3 drops its state at the end."""
        return chunks

    def _generate(self, prompt_ids: np.ndarray, params: Any, streaming: bool) -> Any:
        llm = self.models["tensorrt_llm"]
        return generate_tokens(
            self.pb, llm, prompt_ids, params, params.end_id, params.pad_id, streaming, self.decoupled
        )

    def _wav(self, request: Any) -> np.ndarray | None:
        """`reference_wav` cut to `reference_wav_len` (upstream's clients pad it), or None."""
        wav = optional_input(self.pb, request, "reference_wav")
        if wav is None:
            return None
        wav = wav.reshape(-1)
        length = optional_input(self.pb, request, "reference_wav_len", dtype=np.int32)
        if length is None:
            return wav
        n = int(length.reshape(-1)[0])
        if not 0 < n <= wav.size:  # a negative length once cut from the end, one past it was ignored
            raise RequestError("reference_wav_len", f"must be in 1..{wav.size}, got {n}")
        return wav[:n]

    def _instruction(self, instruct_text: str) -> str:
        """The model's form of a checked instruction (CosyVoice2: as written)."""
        return instruct_text

    def _profile_inputs(self, request: Any) -> Voice | None:
        tokens = optional_row(self.pb, request, "voice_speech_tokens", np.int32)
        if tokens is None:
            return None
        self.checkpoint.check(self.pb, request)
        feat = optional_row(self.pb, request, "voice_speech_feat", np.float32, trailing=(80,))
        embedding = optional_input(self.pb, request, "voice_spk_embedding", dtype=np.float32)
        return check_profile(ProfileInputs(tokens, feat, embedding), flow_prompt=not self.dit)

    def _parse(self, request: Any, target_text: str | None = None) -> CosyVoice2Request:
        parameters = request_parameters(request)
        instruct_text = optional_string(self.pb, request, "instruct_text")
        checked = check_request(
            self._wav(request),
            optional_string(self.pb, request, "reference_text"),
            string_input(self.pb, request, "target_text") if target_text is None else target_text,
            self.limits,
            check_token_budget(parameters, self.max_new_tokens),
            check_mode(parameters.get("mode"), instruct_text),
            instruct_text,
            self._profile_inputs(request),
            profile_needs_wav=self.dit,
            transcript_optional=self.transcript_optional,
        )
        if wants_normalization(parameters, self.text_normalization):
            checked = normalized_texts(checked, self.normalizer)
        if checked.mode != "instruct2":
            return checked
        return replace(checked, instruct_text=self._instruction(checked.instruct_text))

    def _profile(self, request: Any) -> VoiceProfile:
        wav = self._wav(request)
        if wav is None:
            raise RequestError("reference_wav", "is required to make a voice profile")
        voice = self.service.profile(check_reference_wav(wav, self.limits))
        arrays = {
            "speech_tokens": voice.speech_tokens,
            "speech_feat": voice.speech_feat,
            "spk_embedding": voice.embedding,
        }
        kept = {name: arrays[name] for name in KIND_ARRAYS[self.profile_kind]}
        return VoiceProfile(self.profile_kind, self.checkpoint.value, kept)

    def _chunks(self, request: Any) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def _offline(self, request: Any) -> Any:
        try:
            parameters = request_parameters(request)
            if wants_profile(parameters):
                return answer_profile(self.pb, request, False, lambda: self._profile(request))
            if BISTREAM_PARAMETER in parameters:
                raise RequestError(BISTREAM_PARAMETER, "needs the streaming (decoupled) model")
            audio = self.service.synthesize(self._parse(request), request.request_id() or uuid4().hex)
            return self.pb.InferenceResponse([self.pb.Tensor("waveform", audio.reshape(1, -1))])
        except Exception as err:
            return error_response(self.pb, err)

    def _stream(self, request: Any) -> None:
        try:
            parameters = request_parameters(request)
            profile = wants_profile(parameters)
        except Exception:
            parameters, profile = {}, False  # the stream below reports the bad parameter
        if profile:
            answer_profile(self.pb, request, True, lambda: self._profile(request))
            return
        if BISTREAM_PARAMETER in parameters:
            serve_stream(self.pb, request, lambda: self._bistream_chunks(request, parameters))
            return
        serve_stream(self.pb, request, lambda: self._chunks(request))

    def _bistream_chunks(self, request: Any, parameters: dict[str, Any]) -> Iterator[np.ndarray]:
        """A bistream request (docs/streaming-text.md, "Bistream"): an empty first response once the session's
        text inbox exists (push text only after it), then the audio chunks of the text pushed to it, until its
        final push. The inbox is removed when the request ends, however it ends."""
        if self.bistream_tokens is None:
            raise RequestError(BISTREAM_PARAMETER, "is not supported by this model")
        session = parameters[BISTREAM_PARAMETER]
        if not isinstance(session, str):
            raise RequestError(BISTREAM_PARAMETER, "must be a string (a uuid4)")
        idle = self.bistream_idle_timeout_s
        if "bistream_idle_timeout_s" in parameters:  # a request may shorten the model's idle timeout
            idle = min(idle_seconds(parameters["bistream_idle_timeout_s"]), idle)
        target_text = string_input(self.pb, request, "target_text", default="")
        parsed = self._parse(request, target_text or "-")  # the text is checked as it comes
        parsed = replace(parsed, target_text=target_text)
        stream_id = uuid4().hex
        with open_inbox(session) as inbox:
            yield np.zeros(0, dtype=np.float32)
            deltas = checked_length(inbox.deltas(idle, request.is_cancelled), target_text, self.limits)
            chunks = self.service.stream_bistream(parsed, deltas, self.bistream_tokens, stream_id)
            yield from self._streamed(stream_id, chunks)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        return self.runner.execute(requests, self.decoupled, self._stream, self._offline)

    def close(self) -> None:
        self.runner.close()
        if self.llm_http is not None:
            self.llm_http.close()
        release_metrics(self.first_chunks)
        release_held()


class CosyVoice2Bls(CosyVoiceBlsBase):
    def __init__(self, pb_utils: Any, args: dict[str, Any], dit: bool = False) -> None:
        callee_monitor()  # its first read of /proc at load, not in the first request this instance serves
        self.dit = dit
        self.bistream_tokens = BistreamTokens.cosyvoice2()
        self.profile_kind = "cosyvoice2_dit" if dit else "cosyvoice2"
        defaults = {role: role for role in LEAVES} | ({"token2wav": "token2wav_dit"} if dit else {})
        config = self._read_settings(pb_utils, args, defaults)
        llm_dir = Path(model_param(config, "llm_tokenizer_dir"))
        self.prompter = CosyVoice2Prompt.from_llm_dir(llm_dir)
        # the front-end models read the checkpoint beside the LLM (CosyVoice2-0.5B/, Step-Audio-2-mini/)
        self.checkpoint = CheckpointMarker(llm_dir.parent, exclude=[llm_dir])
        endpoint = model_param(config, "llm_endpoint", default="")
        self.llm_http = ChatSpeechClient(ChatEndpoint(endpoint, param="llm_endpoint")) if endpoint else None
        self.service = CosyVoice2Service(
            self.prompter,
            self._tokenize,
            self._embed,
            self._generate,
            self._token2wav_dit if dit else self._token2wav,
            None if dit else default_voice(Path(model_param(config, "model_dir")) / "spk2info.pt"),
            self.prompter.sampling_params(Decoding(max_tokens=self.max_new_tokens)),
            self.schedule,
            self.limits,
            self.voice_cache_size,
            generate_chat=None if self.llm_http is None else self.llm_http.generate,
            flow_prompt=not dit,
            voice_store=self.voice_store,
            complete=None if self.llm_http is None else self._complete,
            end_stream=self._end_dit_stream if dit else None,
        )
        self._start(pb_utils, args, config)

    def _tokenize(self, wav: np.ndarray) -> np.ndarray:
        model = self.models["audio_tokenizer"]
        out = call_model(self.pb, model, reference_wav_arrays(wav), ["prompt_speech_tokens"])
        return out["prompt_speech_tokens"].reshape(-1) - self.prompter.ids.speech_base

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

    def _end_dit_stream(self, voice: Voice, token_offset: int, request_id: str) -> None:
        """A finalize call without tokens: token2wav_dit frees the stream's flow caches (0.4 GB on a full-size
        checkpoint) now rather than after its idle timeout. CosyVoice2's token2wav keeps a few frames per
        stream and would rerun its flow over every token for a finalize call; its idle timeout frees them."""
        try:
            self._token2wav_dit(np.zeros(0, dtype=np.int32), voice, token_offset, True, request_id)
        except Exception:
            log.exception("token2wav_dit: ending the stream %s cut short failed", request_id)

    def _chunks(self, request: Any) -> Iterator[np.ndarray]:
        return self.service.stream(self._parse(request), uuid4().hex, self.first_chunks.add)


def default_voice(spk2info: Path) -> Voice | None:
    """spk2info.pt's speaker "001" as a voice, or None without the file."""
    return Voice.cached(load_spk2info(spk2info)[DEFAULT_SPEAKER]) if spk2info.exists() else None
