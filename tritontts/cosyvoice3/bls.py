"""The CosyVoice3 BLS under Triton (upstream's `model_repo_cosyvoice3/cosyvoice3`): audio_tokenizer +
speaker_embedding → LLM → token2wav (mel) → vocoder, whole or streamed.

The LLM is, with the parameter `llm_api_base` (the URL of an OpenAI-compatible `/v1/chat/completions`, as
upstream's trtllm-serve or `python -m tritontts.llm.openai_server`), that server, asked with upstream's payload;
without it, the `tensorrt_llm`-contract model of the same server. The pipeline is CosyVoice2's service
(`CosyVoice2Service`: voice cache, cached speaker, chunk schedule, first-chunk stages) with CosyVoice3's prompt
and prompt mel; the vocoder is stateless like upstream's, so a stream's accumulated mel lives here and each
chunk re-vocodes it and sends the new samples.

Voice modes and profiles are CosyVoice2's (request parameter `mode`, input `instruct_text`, `voice_*` inputs,
parameter `voice_profile`; see tritontts.triton.cosyvoice2_bls) with CosyVoice3's prompt forms: an instruction is
put in the system part (`"You are a helpful assistant. <instruction><|endofprompt|>"`) unless written that way,
and a zero-shot reference may come without its transcript, as upstream's BLS allows.

Bistream (request parameter `bistream_session`, streaming only; docs/streaming-text.md) is CosyVoice2's with
CosyVoice3's ids (`BistreamTokens.cosyvoice3()`) and prompt text (its system part up to `<|endofprompt|>` right
after `<|sos|>`); with `llm_api_base` its segments go to that server's `/v1/completions`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from tritontts.cosyvoice2.bistream import BistreamTokens
from tritontts.cosyvoice2.llm_http import ChatEndpoint, ChatSpeechClient
from tritontts.cosyvoice2.prompt import Decoding
from tritontts.cosyvoice2.request import Voice
from tritontts.cosyvoice2.service import CosyVoice2Service
from tritontts.cosyvoice2.spk2info import SPK2INFO_FILE
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.cosyvoice3.config import load_cosyvoice3_config
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt, instruct_text, system_part
from tritontts.cosyvoice3.wire import token2wav_arrays, vocoder_arrays
from tritontts.llm.sequence import SamplingParams
from tritontts.triton.bls import call_model, reference_wav_arrays
from tritontts.triton.cosyvoice2_bls import CosyVoiceBlsBase, default_voice
from tritontts.triton.params import model_param
from tritontts.triton.stubs import callee_monitor
from tritontts.triton.voice_profile_io import CheckpointMarker

LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder", "tensorrt_llm")


@dataclass
class _Stream:
    mels: list[np.ndarray] = field(default_factory=list)
    sent: int = 0


class CosyVoice3Bls(CosyVoiceBlsBase):
    profile_kind = "cosyvoice3"
    transcript_optional = True

    def __init__(self, pb_utils: Any, args: dict[str, Any]) -> None:
        callee_monitor()  # its first read of /proc at load, not in the first request this instance serves
        self.bistream_tokens = BistreamTokens.cosyvoice3()
        config = self._read_settings(pb_utils, args, {role: role for role in LEAVES})
        llm_dir = Path(model_param(config, "llm_tokenizer_dir"))
        self.prompter = CosyVoice3Prompt.from_llm_dir(llm_dir)
        # the front-end models read the checkpoint beside the LLM (Fun-CosyVoice3-0.5B-2512/)
        self.checkpoint = CheckpointMarker(llm_dir.parent, exclude=[llm_dir])
        model_dir = Path(model_param(config, "model_dir"))
        endpoint = model_param(config, "llm_api_base", default="")
        self.llm_http = ChatSpeechClient(ChatEndpoint(endpoint, param="llm_api_base")) if endpoint else None
        self.service = CosyVoice2Service(
            self.prompter,  # type: ignore[arg-type]  (CosyVoice2Prompt's interface)
            self._tokenize,
            self._embed,
            self._generate,
            self._token2wav,
            default_voice(model_dir / SPK2INFO_FILE),
            self.prompter.sampling_params(Decoding(max_tokens=self.max_new_tokens)),
            self.schedule,
            self.limits,
            self.voice_cache_size,
            generate_chat=None if self.llm_http is None else self._generate_chat,
            prompt_mel=load_cosyvoice3_config(model_dir).prompt_mel,
            voice_store=self.voice_store,
            complete=None if self.llm_http is None else self._complete,
        )
        self.streams: dict[str, _Stream] = {}
        self.lock = threading.Lock()
        self._start(pb_utils, args, config)

    def _tokenize(self, wav: np.ndarray) -> np.ndarray:
        out = call_model(
            self.pb, self.models["audio_tokenizer"], reference_wav_arrays(wav), ["prompt_speech_tokens"]
        )
        return out["prompt_speech_tokens"].reshape(-1)

    def _generate_chat(
        self,
        reference_text: str,
        target_text: str,
        speech: np.ndarray,
        params: SamplingParams,
        streaming: bool,
    ) -> Iterator[np.ndarray]:
        """Upstream's chat request (the system part prefixed as its BLS does; in cross_lingual and instruct2 the
        user turn is that mode's text and the assistant turn has no speech tokens); `<|s_N|>` → this LLM's ids."""
        assert self.llm_http is not None
        pieces = self.llm_http.generate(
            system_part(reference_text, target_text), target_text, speech, params, streaming
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

    def _instruction(self, text: str) -> str:
        return instruct_text(text)

    def _streamed(self, stream_id: str, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """The chunks; the stream's accumulated mel is dropped however the stream ends."""
        try:
            yield from chunks
        finally:
            self._forget(stream_id)

    def _chunks(self, request: Any) -> Iterator[np.ndarray]:
        stream_id = uuid4().hex
        yield from self._streamed(
            stream_id, self.service.stream(self._parse(request), stream_id, self.first_chunks.add)
        )
