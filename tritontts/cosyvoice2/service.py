"""The CosyVoice2 BLS without Triton: reference audio → voice prompt, LLM → speech tokens, token2wav → audio.

The callables it is given reach the other models (through BLS calls under Triton, directly in tests):

- `tokenize(wav_16k) -> int32 [n]`: speech tokens 0..6560 of a reference audio;
- `embed(wav_16k) -> [192]`: its speaker embedding;
- `generate(prompt_ids, sampling, streaming) -> Iterator[int32 ids]`: the LLM's new ids, in one piece or streamed;
- or `generate_chat(reference_text, target_text, prompt_speech_tokens, sampling, streaming)`, the same ids from
  an LLM that builds its prompt itself (an OpenAI-compatible chat endpoint), used instead of `generate`;
- with it, `complete(prompt_ids, sampling) -> Iterator[int]`: that server's new ids for a token-id prompt
  (`/v1/completions`), which bistream's segment requests use instead of `generate`;
- `token2wav(tokens, voice, token_offset, finalize, stream_id) -> float32 audio`: tokens 0..6560 so far; with
  `token_offset None` one offline call, else one call of a stream (upstream's `token2wav` inputs).

Modes (upstream's front ends): `zero_shot` (the transcript and the reference's speech tokens prompt the LLM),
`cross_lingual` (neither) and `instruct2` (an instruction instead of both); the flow takes the voice in all three.
A voice comes from the reference audio (the front-end models, through the voice cache), from a saved profile
(`profile`: no front-end call) or is the deployment's cached speaker.

A voice without features (`speech_feat None`) is the deployment's cached speaker: token2wav uses its own copy.
`prompt_mel` is the flow's prompt mel (CosyVoice3's differs). With `flow_prompt=False` (the DiT token2wav,
which makes its prompt from the reference audio itself) a voice holds the reference's speech tokens, uncut, and
the audio instead of the mel and embedding, and `embed` is not called.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import numpy as np
import torch

from tritontts.cosyvoice2.bistream import BistreamTokens, run_bistream
from tritontts.cosyvoice2.frontend import (
    INPUT_SAMPLE_RATE,
    PROMPT_MEL,
    align_prompt_lengths,
    prompt_speech_feat,
)
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.cosyvoice2.request import CosyVoice2Request, Voice
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.dsp.hann_sinc_resample import hann_sinc_resample
from tritontts.dsp.matcha_mel import MatchaMelConfig
from tritontts.llm.sequence import SamplingParams
from tritontts.spark.service import RequestLimits
from tritontts.stage_timer import StageTimer
from tritontts.triton.params import RequestError
from tritontts.voice_cache import VoiceCache, audio_key
from tritontts.voice_store import SharedVoiceStore

SAMPLE_RATE = 24000
TOKEN_RATE = 25


def prompt_features(
    wav_16k: np.ndarray, speech_tokens: np.ndarray, prompt_mel: MatchaMelConfig = PROMPT_MEL
) -> tuple[np.ndarray, np.ndarray]:
    """The 24 kHz prompt mel of a reference and its tokens, cut to each other's length as upstream does."""
    wav_24k = hann_sinc_resample(torch.from_numpy(wav_16k), INPUT_SAMPLE_RATE, prompt_mel.sampling_rate)
    tokens, feat = align_prompt_lengths(speech_tokens, prompt_speech_feat(wav_24k, prompt_mel))
    return tokens.astype(np.int32), feat


Tokenize = Callable[[np.ndarray], np.ndarray]
Embed = Callable[[np.ndarray], np.ndarray]
Generate = Callable[[np.ndarray, SamplingParams, bool], Iterator[np.ndarray]]
GenerateChat = Callable[[str, str, np.ndarray, SamplingParams, bool], Iterator[np.ndarray]]
Complete = Callable[[list[int], SamplingParams], Iterator[int]]
Token2WavCall = Callable[[np.ndarray, Voice, "int | None", "bool | None", str], np.ndarray]
FirstChunkStages = Callable[[dict[str, float]], None]
EndStream = Callable[[Voice, int, str], None]
"""Ends a token2wav stream cut short after its first chunk (voice, token offset, request id): frees its state."""
FIRST_CHUNK_STAGES = ("frontend", "llm_first_token", "llm_chunk_tokens", "token2wav")
"""A stream's first chunk: the voice (front-end models, or the voice cache), the LLM until its first token, the LLM
until the chunk's tokens (hop + look-ahead) exist, and token2wav on them."""


def prompt_parts(voice: Voice, request: CosyVoice2Request) -> tuple[str, np.ndarray]:
    """The text and speech tokens that prompt the LLM before the target text, by voice mode: the transcript and
    the reference's tokens (zero_shot), nothing (cross_lingual), the instruction alone (instruct2)."""
    no_speech = np.zeros(0, dtype=np.int32)
    return {
        "zero_shot": (voice.text, voice.speech_tokens),
        "cross_lingual": ("", no_speech),
        "instruct2": (request.instruct_text, no_speech),
    }[request.mode]


class CosyVoice2Service:
    def __init__(
        self,
        prompter: CosyVoice2Prompt,
        tokenize: Tokenize,
        embed: Embed,
        generate: Generate,
        token2wav: Token2WavCall,
        default_voice: Voice | None,
        sampling: SamplingParams,
        schedule: StreamSchedule | None = None,
        limits: RequestLimits | None = None,
        voice_cache_size: int = 256,
        generate_chat: GenerateChat | None = None,
        flow_prompt: bool = True,
        prompt_mel: MatchaMelConfig = PROMPT_MEL,
        voice_store: SharedVoiceStore[Voice] | None = None,
        complete: Complete | None = None,
        end_stream: EndStream | None = None,
    ) -> None:
        self.prompter = prompter
        self.end_stream = end_stream
        self.complete = complete
        self.tokenize = tokenize
        self.embed = embed
        self.generate = generate
        self.generate_chat = generate_chat
        self.token2wav = token2wav
        self.default_voice = default_voice
        self.sampling = sampling
        self.schedule = schedule or StreamSchedule()
        self.limits = limits or RequestLimits()
        self.voices: VoiceCache[Voice] = VoiceCache(voice_cache_size, voice_store)
        self.flow_prompt = flow_prompt
        self.prompt_mel = prompt_mel

    def voice(self, request: CosyVoice2Request) -> Voice:
        if request.profile is not None:
            return replace(request.profile, text=request.reference_text, reference_wav=request.reference_wav)
        if request.reference_wav is None:
            if self.default_voice is None:
                raise RequestError("reference_wav", "is required: this deployment has no cached speaker")
            return self.default_voice
        wav = request.reference_wav
        key = audio_key(wav, INPUT_SAMPLE_RATE, "cosyvoice2")
        voice = self.voices.get(key)
        if voice is None:
            voice = self._new_voice(wav)
            self.voices.put(key, voice)
        return replace(voice, text=request.reference_text)

    def profile(self, wav: np.ndarray) -> Voice:
        """A checked reference's prompt features for a saved voice's profile: from the models, not the cache."""
        return self._new_voice(wav)

    def _new_voice(self, wav: np.ndarray) -> Voice:
        if not self.flow_prompt:
            return Voice("", np.asarray(self.tokenize(wav), dtype=np.int32).reshape(-1), reference_wav=wav)
        tokens, feat = prompt_features(wav, self.tokenize(wav), self.prompt_mel)
        return Voice("", tokens, feat, np.asarray(self.embed(wav), dtype=np.float32).reshape(-1))

    def _speech(self, request: CosyVoice2Request, streaming: bool) -> tuple[Voice, Iterator[np.ndarray]]:
        voice = self.voice(request)
        return voice, self._generate_for(voice, request, streaming)

    def _generate_for(
        self, voice: Voice, request: CosyVoice2Request, streaming: bool
    ) -> Iterator[np.ndarray]:
        sampling = self.sampling
        if request.tokens is not None:
            sampling = replace(
                sampling, min_tokens=request.tokens.min_tokens, max_tokens=request.tokens.max_tokens
            )
        prefix, speech = prompt_parts(voice, request)
        if self.generate_chat is not None:  # the chat server tokenizes prefix and target together
            return self.generate_chat(prefix, request.target_text, speech, sampling, streaming)
        if request.mode == "instruct2":
            ids = self.prompter.instruct2_ids(request.instruct_text, request.target_text)
        elif request.mode == "cross_lingual":
            ids = self.prompter.cross_lingual_ids(request.target_text)
        else:
            ids = self.prompter.input_ids(voice.text, request.target_text, voice.speech_tokens)
        return self.generate(np.asarray(ids, dtype=np.int32), sampling, streaming)

    def synthesize(self, request: CosyVoice2Request, request_id: str) -> np.ndarray:
        voice, pieces = self._speech(request, streaming=False)
        tokens = [t for ids in pieces for t in self.prompter.speech_tokens(ids.tolist())]
        if not tokens:
            raise RuntimeError("the LLM generated no speech tokens")
        return self.token2wav(np.asarray(tokens, dtype=np.int32), voice, None, None, request_id)

    def stream(
        self, request: CosyVoice2Request, request_id: str, on_first_chunk: FirstChunkStages | None = None
    ) -> Iterator[np.ndarray]:
        """Audio chunks to play back to back (token2wav cross-fades them itself), as upstream's BLS sends them.

        A chunk is vocoded once `token_offset + hop + pre_lookahead` tokens exist; the last call finalizes.
        `on_first_chunk` gets the seconds of each of `FIRST_CHUNK_STAGES` once the first chunk has been taken
        from this generator (sent) and this generator resumed or closed. Closing this generator early closes the
        LLM stream, which cancels generation.
        """
        timer = StageTimer()
        voice = self.voice(request)
        timer.mark("frontend")
        pieces = self._generate_for(voice, request, streaming=True)
        speech = (self.prompter.speech_tokens(ids.tolist()) for ids in pieces)
        yield from self._vocoded(speech, pieces, voice, request_id, timer, on_first_chunk)

    def stream_bistream(
        self,
        request: CosyVoice2Request,
        deltas: Iterable[str],
        tokens: BistreamTokens,
        request_id: str,
        on_first_chunk: FirstChunkStages | None = None,
    ) -> Iterator[np.ndarray]:
        """`stream` of an utterance whose text arrives as `deltas` while it is spoken (upstream's
        `inference_bistream`; tritontts.cosyvoice2.bistream): each delta is tokenized on its own, without text
        normalization, and the LLM runs as a chain of segment requests over `generate`, or `complete` when the
        LLM is a server elsewhere. `request.target_text`, when not empty, is the first delta. Modes: zero_shot
        (the transcript and the reference's speech tokens prompt the schedule), cross_lingual (neither) and
        instruct2 (the instruction is the prompt text); the prompter gives the prompt text's ids
        (`bistream_prompt_ids`: CosyVoice3's carry its system part)."""
        if self.generate_chat is not None and self.complete is None:
            raise RequestError(
                "bistream_session",
                "needs token-id prompts: this BLS asks an OpenAI-compatible chat endpoint and has no "
                "completions endpoint",
            )
        if self.prompter.ids.speech_base != tokens.speech_base:
            raise RuntimeError(
                f"bistream: the served LLM's speech tokens start at {self.prompter.ids.speech_base}, "
                f"{tokens.family}'s at {tokens.speech_base}"
            )
        timer = StageTimer()
        voice = self.voice(request)
        timer.mark("frontend")
        prompt_text, prompt_speech = prompt_parts(voice, request)
        sampling = self.sampling
        if request.tokens is not None:
            sampling = replace(sampling, max_tokens=request.tokens.max_tokens)

        def segment(ids: list[int], max_tokens: int, end_id: int, bad_ids: tuple[int, ...]) -> Iterator[int]:
            params = replace(
                sampling,
                max_tokens=max_tokens,
                min_tokens=0,
                end_id=end_id,
                pad_id=end_id,
                bad_token_ids=bad_ids,
            )
            if self.complete is not None:
                return self.complete(ids, params)
            return generated_ids(ids, params)

        def generated_ids(ids: list[int], params: SamplingParams) -> Iterator[int]:
            pieces = self.generate(np.asarray(ids, dtype=np.int32), params, True)
            try:
                for piece in pieces:
                    yield from (int(t) for t in piece)
            finally:
                close = getattr(pieces, "close", None)
                if close is not None:
                    close()

        texts = [request.target_text] if request.target_text else []
        text_ids = (self.prompter.text_ids(d) for d in itertools.chain(texts, deltas) if d)
        speech = run_bistream(
            text_ids,
            segment,
            tokens,
            self.prompter.bistream_prompt_ids(prompt_text),
            [int(t) for t in prompt_speech],
            sampling.max_tokens,
        )
        yield from self._vocoded(([t] for t in speech), speech, voice, request_id, timer, on_first_chunk)

    def _vocoded(
        self,
        speech: Iterable[list[int]],
        source: Iterator,
        voice: Voice,
        request_id: str,
        timer: StageTimer,
        on_first_chunk: FirstChunkStages | None,
    ) -> Iterator[np.ndarray]:
        """token2wav's chunks of the speech tokens as they come in pieces (`speech`, read from `source`, which is
        closed at the end or when this generator is closed), on the stream schedule."""
        started = time.monotonic()
        tokens: list[int] = []
        offset, index, hop = 0, 0, self.schedule.token_hop_len
        next_offset: int | None = None  # token2wav holds this stream's state; its next call's token offset
        try:
            for piece in speech:
                if index == 0 and "llm_first_token" not in timer.stages:
                    timer.mark("llm_first_token")
                tokens += piece
                while len(tokens) >= offset + hop + self.schedule.pre_lookahead_len:
                    end = offset + hop + self.schedule.pre_lookahead_len
                    chunk = np.asarray(tokens[:end], dtype=np.int32)
                    if index == 0:
                        timer.mark("llm_chunk_tokens")
                    audio = self.token2wav(chunk, voice, offset, False, request_id)
                    next_offset = offset + hop
                    if index == 0:
                        timer.mark("token2wav")
                    try:
                        yield audio
                    finally:  # once the chunk is sent (or the stream closed after it): recording never delays it
                        if index == 0 and on_first_chunk is not None:
                            on_first_chunk(timer.stages)
                    offset += hop
                    hop = self.schedule.next_hop(index, offset, len(tokens), time.monotonic() - started)
                    index += 1
        except BaseException:  # a cancelled stream (GeneratorExit) or an error: no finalize call follows
            if next_offset is not None and self.end_stream is not None:
                self.end_stream(voice, next_offset, request_id)
            raise
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
        if not tokens:
            raise RuntimeError("the LLM generated no speech tokens")
        yield self.token2wav(np.asarray(tokens, dtype=np.int32), voice, offset, True, request_id)
