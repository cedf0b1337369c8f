"""What the `spark_tts` BLS model does, independent of Triton: check a request, find the voice, prompt the LLM,
turn the generated tokens into audio, whole or in chunks.

The three calls into other models are injected, so the same code runs under Triton (BLS requests) and in
one process (offline inference, tests).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tritontts.audio import AudioError, AudioLimits, check_waveform
from tritontts.spark.prompt import (
    END_CONTENT,
    END_GLOBAL,
    GENDERS,
    GLOBAL_CODEBOOK,
    GLOBAL_TOKEN_COUNT,
    LEVELS,
    SEMANTIC_CODEBOOK,
    START_CONTENT,
    START_GLOBAL,
    START_SEMANTIC,
    TASK_TTS,
    SparkTokenIds,
    VoiceControl,
    build_control_prompt,
    load_llm_tokenizer,
    read_eos_token,
)
from tritontts.stage_timer import StageTimer
from tritontts.streaming import ChunkSchedule, TokenChunker
from tritontts.triton.llm_contract import SamplingParams
from tritontts.triton.params import RequestError
from tritontts.voice_cache import VoiceCache, audio_key
from tritontts.voice_store import SharedVoiceStore

SAMPLE_RATE = 16000
TOKEN_RATE = 50


@dataclass(frozen=True)
class VoiceTokens:
    global_tokens: np.ndarray
    semantic_tokens: np.ndarray


@dataclass(frozen=True)
class TokenBudget:
    """A request's own bounds on generated tokens (the `min_new_tokens` / `max_new_tokens` request parameters)."""

    min_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class SparkRequest:
    """One of three voices: `reference_wav` (cloned: the audio_tokenizer makes its tokens), `voice` (a saved
    profile's tokens: no audio_tokenizer call) or `control` (voice creation: the LLM makes the speaker too)."""

    reference_wav: np.ndarray | None
    reference_text: str
    target_text: str
    tokens: TokenBudget | None = None
    voice: VoiceTokens | None = None
    control: VoiceControl | None = None


@dataclass(frozen=True)
class RequestLimits:
    max_text_length: int = 1000
    audio: AudioLimits = AudioLimits()


TokenizeVoice = Callable[[np.ndarray], VoiceTokens]
Generate = Callable[[np.ndarray, SamplingParams, bool], Iterator[np.ndarray]]
Vocode = Callable[[np.ndarray, np.ndarray, bool], np.ndarray]
"""(global tokens, semantic tokens, whether they are a stream's first chunk) → audio."""
FirstChunkStages = Callable[[dict[str, float]], None]
FIRST_CHUNK_STAGES = ("frontend", "llm_first_token", "llm_chunk_tokens", "vocoder")
"""A stream's first chunk: the voice (audio_tokenizer, or the voice cache) and prompt, the LLM until its first
token, the LLM until the chunk's semantic tokens exist, and the vocoder on them."""


def check_text(value: str, field: str, limits: RequestLimits, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise RequestError(field, f"must be a UTF-8 string, got {type(value).__name__}")
    if not value.strip() and not allow_empty:
        raise RequestError(field, "is empty")
    if len(value) > limits.max_text_length:
        raise RequestError(
            field, f"has {len(value)} characters; at most {limits.max_text_length} are accepted"
        )
    return value


def check_reference_wav(wav: np.ndarray, limits: RequestLimits) -> np.ndarray:
    try:
        return check_waveform(wav, SAMPLE_RATE, limits.audio, name="reference_wav")
    except AudioError as err:
        raise RequestError("reference_wav", str(err).removeprefix("reference_wav ")) from err


def check_token_budget(parameters: dict, default_max: int) -> TokenBudget | None:
    """`min_new_tokens` / `max_new_tokens` request parameters (benchmarks force lengths with them)."""
    if not any(k in parameters for k in ("min_new_tokens", "max_new_tokens")):
        return None
    values = {}
    for key, default in (("min_new_tokens", 0), ("max_new_tokens", default_max)):
        value = parameters.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= default_max:
            raise RequestError(key, f"must be an integer in 0..{default_max}, got {value!r}")
        values[key] = value
    if values["max_new_tokens"] < max(1, values["min_new_tokens"]):
        raise RequestError("max_new_tokens", "must be >= 1 and >= min_new_tokens")
    return TokenBudget(values["min_new_tokens"], values["max_new_tokens"])


def check_voice_tokens(global_tokens: np.ndarray, semantic_tokens: np.ndarray | None) -> VoiceTokens:
    """A profile's tokens (fields `voice_global_tokens`, `voice_semantic_tokens`), range-checked."""
    g = np.asarray(global_tokens).reshape(-1)
    if g.size != GLOBAL_TOKEN_COUNT:
        raise RequestError("voice_global_tokens", f"must hold {GLOBAL_TOKEN_COUNT} tokens, got {g.size}")
    s = np.zeros(0, dtype=np.int32) if semantic_tokens is None else np.asarray(semantic_tokens).reshape(-1)
    for name, values, size in (
        ("voice_global_tokens", g, GLOBAL_CODEBOOK),
        ("voice_semantic_tokens", s, SEMANTIC_CODEBOOK),
    ):
        if values.size and (values.min() < 0 or values.max() >= size):
            raise RequestError(name, f"values must be in 0..{size - 1}")
    return VoiceTokens(g.astype(np.int32), s.astype(np.int32))


def check_control(gender: str | None, pitch: str | None, speed: str | None) -> VoiceControl | None:
    """Voice creation's inputs: gender (required once any is given), pitch and speed levels (default moderate)."""
    if gender is None and pitch is None and speed is None:
        return None
    if gender not in GENDERS:
        state = "is required for voice creation" if gender is None else f"is {gender!r}"
        raise RequestError("gender", f"{state}; one of {', '.join(GENDERS)}")
    for name, value in (("pitch", pitch), ("speed", speed)):
        if value is not None and value not in LEVELS:
            raise RequestError(name, f"is {value!r}; one of {', '.join(LEVELS)}")
    return VoiceControl(gender, pitch or "moderate", speed or "moderate")


def check_request(
    reference_wav: np.ndarray | None,
    reference_text: str | None,
    target_text: str,
    limits: RequestLimits,
    tokens: TokenBudget | None = None,
    voice: VoiceTokens | None = None,
    control: VoiceControl | None = None,
) -> SparkRequest:
    """Exactly one voice: a reference audio, a profile's tokens, or voice creation's attributes."""
    if control is not None:
        given = [
            n for n, v in (("reference_wav", reference_wav), ("voice_global_tokens", voice)) if v is not None
        ]
        if reference_text is not None:
            given.append("reference_text")
        if given:
            raise RequestError(given[0], "voice creation (gender, pitch, speed) takes no reference voice")
        return SparkRequest(None, "", check_text(target_text, "target_text", limits), tokens, control=control)
    if reference_wav is not None and voice is not None:
        raise RequestError("voice_global_tokens", "send either reference_wav or a voice profile, not both")
    if reference_wav is None and voice is None:
        raise RequestError(
            "reference_wav",
            "is required (or voice_global_tokens of a saved voice, or gender for voice creation)",
        )
    if reference_text is None:
        raise RequestError("reference_text", "is required")
    text = check_text(reference_text, "reference_text", limits, allow_empty=True)
    if voice is not None and text and not voice.semantic_tokens.size:
        raise RequestError("voice_semantic_tokens", "are required with a reference_text")
    wav = None if reference_wav is None else check_reference_wav(reference_wav, limits)
    return SparkRequest(wav, text, check_text(target_text, "target_text", limits), tokens, voice=voice)


class SparkPrompter:
    """Prompt token ids for the Spark-TTS LLM, exactly as tokenizing upstream's prompt string gives them."""

    def __init__(self, llm_dir: str | Path) -> None:
        self.tokenizer = load_llm_tokenizer(llm_dir)
        self.ids = SparkTokenIds.from_llm_dir(llm_dir)
        self.pad_id = self._pad_id(Path(llm_dir))
        self._marker = {
            m: self.tokenizer.token_to_id(m)
            for m in (TASK_TTS, START_CONTENT, END_CONTENT, START_GLOBAL, END_GLOBAL, START_SEMANTIC)
        }
        # a process's first prompt (the tokenizer's first encode, numpy's first calls) costs several later ones,
        # which each BLS instance's first request paid: one is made at load
        warm_voice = VoiceTokens(np.zeros(GLOBAL_TOKEN_COUNT, dtype=np.int32), np.zeros(1, dtype=np.int32))
        self.prompt_ids("预热。", "Warm up, 预热。", warm_voice)

    def _pad_id(self, llm_dir: Path) -> int:
        config = json.loads((llm_dir / "tokenizer_config.json").read_text())
        pad = config.get("pad_token")
        pad = pad.get("content") if isinstance(pad, dict) else pad
        pad_id = self.tokenizer.token_to_id(pad) if pad else None
        return pad_id if pad_id is not None else self.tokenizer.token_to_id(read_eos_token(llm_dir))

    @property
    def end_id(self) -> int:
        return self.ids.eos

    def prompt_ids(self, reference_text: str, target_text: str, voice: VoiceTokens) -> np.ndarray:
        m = self._marker
        text_ids = self.tokenizer.encode(reference_text + target_text, add_special_tokens=False).ids
        parts = [
            [m[TASK_TTS], m[START_CONTENT], *text_ids, m[END_CONTENT], m[START_GLOBAL]],
            self.ids.global_token_ids(voice.global_tokens),
            [m[END_GLOBAL]],
        ]
        if reference_text:
            parts += [[m[START_SEMANTIC]], self.ids.semantic_token_ids(voice.semantic_tokens)]
        return np.concatenate([np.asarray(part, dtype=np.int64) for part in parts]).astype(np.int32)

    def control_prompt_ids(self, target_text: str, control: VoiceControl) -> np.ndarray:
        """Upstream's voice-creation prompt string (`process_prompt_control`), tokenized as upstream does."""
        prompt = build_control_prompt(target_text, control.gender, control.pitch, control.speed)
        return np.asarray(self.tokenizer.encode(prompt, add_special_tokens=False).ids, dtype=np.int32)


class SparkTTSService:
    def __init__(
        self,
        prompter: SparkPrompter,
        tokenize_voice: TokenizeVoice,
        generate: Generate,
        vocode: Vocode,
        sampling: SamplingParams | None = None,
        schedule: ChunkSchedule | None = None,
        limits: RequestLimits = RequestLimits(),
        voice_cache_size: int = 256,
        voice_store: SharedVoiceStore[VoiceTokens] | None = None,
    ) -> None:
        self.prompter = prompter
        self.tokenize_voice = tokenize_voice
        self.generate = generate
        self.vocode = vocode
        self.sampling = sampling or SamplingParams()
        self.schedule = schedule or ChunkSchedule.from_durations(1.0, 30.0, 8.0, 0.1, TOKEN_RATE)
        self.limits = limits
        self.voices: VoiceCache[VoiceTokens] = VoiceCache(voice_cache_size, voice_store)

    def voice(self, wav: np.ndarray) -> VoiceTokens:
        key = audio_key(wav, SAMPLE_RATE, "spark_tts")
        voice = self.voices.get(key)
        if voice is None:
            voice = self.tokenize_voice(wav)
            self.voices.put(key, voice)
        return voice

    def profile(self, wav: np.ndarray) -> VoiceTokens:
        """A checked reference's tokens for a saved voice's profile: from the audio_tokenizer, not the cache."""
        return self.tokenize_voice(wav)

    def _generate(
        self, request: SparkRequest, streaming: bool, timer: StageTimer | None = None
    ) -> tuple[VoiceTokens | None, Iterator[np.ndarray]]:
        """The voice (None while voice creation's LLM has yet to make it) and the LLM's token stream; `timer`
        marks the front end (voice and prompt) before the LLM is asked."""
        sampling = self.sampling
        if request.tokens is not None:
            sampling = replace(
                sampling, min_tokens=request.tokens.min_tokens, max_tokens=request.tokens.max_tokens
            )
        voice = None
        if request.control is not None:
            prompt = self.prompter.control_prompt_ids(request.target_text, request.control)
        else:
            voice = request.voice if request.voice is not None else self.voice(request.reference_wav)
            prompt = self.prompter.prompt_ids(request.reference_text, request.target_text, voice)
        if timer is not None:
            timer.mark("frontend")
        return voice, self.generate(prompt, sampling, streaming)

    def _created_globals(self, global_ids: list[int]) -> np.ndarray:
        if len(global_ids) < GLOBAL_TOKEN_COUNT:
            raise RuntimeError(
                f"voice creation: the LLM generated {len(global_ids)} global tokens, {GLOBAL_TOKEN_COUNT} are needed"
            )
        return np.asarray(global_ids[:GLOBAL_TOKEN_COUNT], dtype=np.int32)

    def synthesize(self, request: SparkRequest) -> np.ndarray:
        voice, stream = self._generate(request, streaming=False)
        generated = [int(t) for ids in stream for t in ids.tolist()]
        semantic = self.prompter.ids.semantic_ids(generated)
        if not semantic:
            raise RuntimeError("the LLM generated no semantic tokens")
        if voice is None:
            global_tokens = self._created_globals(self.prompter.ids.global_ids(generated))
        else:
            global_tokens = voice.global_tokens
        return self.vocode(global_tokens, np.asarray(semantic, dtype=np.int32), False)

    def stream(
        self, request: SparkRequest, on_first_chunk: FirstChunkStages | None = None
    ) -> Iterator[np.ndarray]:
        """Audio chunks that overlap by the schedule's overlap, for the client to cross-fade.

        `on_first_chunk` gets the seconds of each of `FIRST_CHUNK_STAGES` once the first chunk has been taken
        from this generator (sent) and this generator resumed or closed, so that recording them never delays it.
        Closing this generator early (a cancelled request) closes the LLM stream, which cancels generation.
        """
        timer = StageTimer()
        voice, stream = self._generate(request, streaming=True, timer=timer)
        global_tokens = None if voice is None else voice.global_tokens
        created: list[int] = []  # voice creation: global tokens so far; chunks wait until there are 32
        pending: list[list[int]] = []
        chunker = TokenChunker(self.schedule)
        vocoded = 0

        def vocode(chunk: list[int]) -> Iterator[np.ndarray]:
            nonlocal vocoded
            first = vocoded == 0
            if first:
                timer.mark("llm_chunk_tokens")
            audio = self.vocode(global_tokens, np.asarray(chunk, dtype=np.int32), first)
            vocoded += 1
            if first:
                timer.mark("vocoder")
            try:
                yield audio
            finally:  # once it is sent, or its stream closed after it was
                if first and on_first_chunk is not None:
                    on_first_chunk(timer.stages)

        try:
            for ids in stream:
                if "llm_first_token" not in timer.stages:
                    timer.mark("llm_first_token")
                if global_tokens is None:
                    created += self.prompter.ids.global_ids(ids.tolist())
                    if len(created) >= GLOBAL_TOKEN_COUNT:
                        global_tokens = self._created_globals(created)
                pending += chunker.push(self.prompter.ids.semantic_ids(ids.tolist()))
                while pending and global_tokens is not None:
                    yield from vocode(pending.pop(0))
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        last = chunker.finish()
        if last is None and chunker.emitted == 0:
            raise RuntimeError("the LLM generated no semantic tokens")
        if global_tokens is None:
            global_tokens = self._created_globals(created)
        for chunk in [*pending, *([last] if last else [])]:
            yield from vocode(chunk)
