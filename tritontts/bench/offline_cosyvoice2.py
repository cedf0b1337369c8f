"""CosyVoice2 in one process: front end (speech tokenizer v2, 24 kHz prompt mel, CAMPPlus) → LLM → token2wav
(flow + HiFT), batch by batch.

`--model-dir` is the folder holding `CosyVoice2-0.5B/` and `cosyvoice2_llm/` (what run.sh stage 0 writes). The
front end runs one reference at a time, the LLM all prompts of a batch together, token2wav one row at a time
(offline, as upstream's `token2wav_batch_size=1`). Generated ids that are not speech tokens are dropped, as
upstream's offline script drops them when it decodes the text.

The token2wav side is a strategy (`Token2WavStrategy`): this module's flow + HiFT, or the DiT token2wav of
`offline_cosyvoice2_dit`; the LLM side is any backend of `offline_llm`, or the `openai` chat endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_cosyvoice2_prompt import (
    TOKEN_RATE,
    SpeechGenerate,
    SpeechPrompt,
    decoding_of,
    id_backend,
    plan_max_seq_len,
)
from tritontts.bench.offline_llm import llm_backend, resolve_dtype
from tritontts.bench.offline_openai import ChatSpeechBackend
from tritontts.bench.offline_pipeline import forced_token_counts
from tritontts.bench.offline_results import StageNames, StageTimes
from tritontts.bench.offline_settings import OfflineSettings
from tritontts.bench.offline_timing import synchronize, timed
from tritontts.cosyvoice2.frontend import INPUT_SAMPLE_RATE, CosyVoice2Frontend, PromptFeatures
from tritontts.cosyvoice2.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, CosyVoice2Prompt
from tritontts.cosyvoice2.token2wav import Token2Wav
from tritontts.devices import resolve_flow_dtype

NAMES = StageNames(front="frontend", back="token2wav", speech_tokens="speech_tokens")
SAMPLE_RATE = 24000
MAX_NEW_TOKENS = UPSTREAM_DECODING.max_tokens


def frontend_device(device: torch.device) -> str:
    """The speech tokenizer runs on the GPU when onnxruntime can (CAMPPlus stays on CPU, as upstream)."""
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return "cuda" if device.index is None else f"cuda:{device.index}"
    return "cpu"


class Token2WavStrategy(Protocol):
    """What turns a reference into a voice (its `speech_tokens` go into the LLM prompt) and speech tokens into
    audio at 24 kHz; `forget_voices` drops whatever it caches per reference."""

    def voice(self, wav_16k: np.ndarray) -> Any: ...

    def vocode(self, tokens: list[int], voice: Any) -> np.ndarray: ...

    def forget_voices(self) -> None: ...


class FlowToken2Wav:
    """CosyVoice2-0.5B's own token2wav: the front end's aligned prompt tokens, mel and x-vector, flow + HiFT."""

    def __init__(self, frontend: CosyVoice2Frontend, token2wav: Token2Wav) -> None:
        self.frontend = frontend
        self.token2wav = token2wav

    def voice(self, wav_16k: np.ndarray) -> PromptFeatures:
        return self.frontend(wav_16k)

    def vocode(self, tokens: list[int], voice: PromptFeatures) -> np.ndarray:
        audio = self.token2wav.offline(
            torch.tensor([tokens], dtype=torch.int32),
            torch.from_numpy(voice.speech_tokens[None]),
            torch.from_numpy(voice.speech_feat[None]),
            torch.from_numpy(voice.spk_embedding[None]),
        )
        return audio[0].float().cpu().numpy()

    def forget_voices(self) -> None:
        pass


class CosyVoice2Pipeline:
    names = NAMES
    sample_rate = SAMPLE_RATE
    token_rate = TOKEN_RATE

    def __init__(
        self,
        prompter: CosyVoice2Prompt,
        generate: SpeechGenerate,
        token2wav: Token2WavStrategy,
        device: torch.device,
        max_seq_len: int | None,
    ) -> None:
        self.prompter = prompter
        self.generate = generate
        self.token2wav = token2wav
        self.device = device
        self.decoding = decoding_of(prompter)
        self.max_seq_len = max_seq_len

    def speech_tokens(self, generated: list[int]) -> list[int]:
        base = self.prompter.ids.speech_base
        return [t - base for t in generated if self.prompter.ids.is_speech(t)]

    def speech_token_count(self, generated: list[int]) -> int:
        return len(self.speech_tokens(generated))

    def after_warmup(self) -> None:
        self.token2wav.forget_voices()

    def _prompt(self, row: Utterance, voice: Any) -> SpeechPrompt:
        tokens = np.asarray(voice.speech_tokens, dtype=np.int32)
        ids = self.prompter.input_ids(row.prompt_text, row.target_text, tokens)
        return SpeechPrompt(row.prompt_text, row.target_text, tokens, np.asarray(ids, dtype=np.int32))

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]:
        synchronize(self.device)
        start = time.perf_counter()
        voices, frontend_s = timed(self.device, lambda: [self.token2wav.voice(w) for w in wavs])
        prompts = [self._prompt(u, v) for u, v in zip(rows, voices, strict=True)]
        generated, llm_s = timed(self.device, self.generate, prompts, list(forced))
        speech = [self.speech_tokens(ids) for ids in generated]
        audio = [np.zeros(0, dtype=np.float32) for _ in rows]
        token2wav_s = 0.0
        for i, tokens in enumerate(speech):
            if tokens:
                audio[i], seconds = timed(self.device, self.token2wav.vocode, tokens, voices[i])
                token2wav_s += seconds
        synchronize(self.device)
        times = StageTimes(
            rows=len(rows),
            front_s=frontend_s,
            llm_s=llm_s,
            back_s=token2wav_s,
            wall_s=time.perf_counter() - start,
            tokens=sum(len(g) for g in generated),
            speech_tokens=sum(len(s) for s in speech),
            audio_s=sum(len(a) for a in audio) / SAMPLE_RATE,
        )
        return audio, generated, times


def require_folders(root: Path, folders: Sequence[str], writer: str) -> None:
    missing = [name for name in folders if not (root / name).is_dir()]
    if missing:
        listed = ", ".join(f"{name}/" for name in folders)
        raise FileNotFoundError(f"{root / missing[0]} not found: --model-dir must hold {listed} ({writer})")


@dataclass(frozen=True)
class LLMSide:
    """The LLM half of either CosyVoice2 pipeline, and what the report says about it."""

    prompter: CosyVoice2Prompt
    generate: SpeechGenerate
    max_seq_len: int | None
    report: dict


def llm_side(
    settings: OfflineSettings,
    rows: Sequence[Utterance],
    device: torch.device,
    llm_subdir: str = LLM_DIR,
    prompter_class: Any = CosyVoice2Prompt,
) -> LLMSide:
    """The backend: in process on `cosyvoice2_llm/`, or the chat endpoint (its tokenizer still read here);
    an unreachable endpoint fails here, before token2wav loads. `llm_subdir` and `prompter_class` serve
    CosyVoice3 (its HF LLM folder and prompt layout)."""
    llm_dir = Path(settings.model_dir) / llm_subdir
    prompter = prompter_class.from_llm_dir(llm_dir)
    decoding = decoding_of(prompter)
    max_new_tokens = settings.max_new_tokens or MAX_NEW_TOKENS
    if settings.backend == "openai":
        backend = ChatSpeechBackend(
            settings.llm_endpoint or "",
            settings.llm_model,
            decoding,
            max_new_tokens,
            settings.seed,
            prompter.ids.speech_base,
            max(settings.batch_sizes),
        )
        backend.check_reachable()
        report = {"dtype": None, "llm_endpoint": backend.url, "llm_model": settings.llm_model}
        return LLMSide(prompter, backend, None, report)
    dtype = resolve_dtype(settings.dtype, device, llm_dir)
    forced = forced_token_counts(rows, settings.realistic_lengths, TOKEN_RATE)
    most = max((n for n in forced if n is not None), default=max_new_tokens)
    max_seq_len = settings.max_seq_len or plan_max_seq_len(rows, prompter, most)
    generate = llm_backend(settings, llm_dir, decoding, device, dtype, max_seq_len, max_new_tokens)
    report = {"dtype": str(dtype).removeprefix("torch.")}
    return LLMSide(prompter, id_backend(generate), max_seq_len, report)


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[CosyVoice2Pipeline, int, dict]:
    """The pipeline, the rate its reference audio is read at, and what the report says about its dtypes."""
    root = Path(settings.model_dir)
    require_folders(root, (MODEL_DIR, LLM_DIR), "run.sh stage 0 writes both")
    llm = llm_side(settings, rows, device)
    flow_dtype = resolve_flow_dtype(settings.token2wav_dtype, device)
    model_dir = root / MODEL_DIR
    frontend = CosyVoice2Frontend.from_model_dir(model_dir, tokenizer_device=frontend_device(device))
    token2wav = FlowToken2Wav(
        frontend, Token2Wav.from_model_dir(model_dir, device, flow_dtype, seed=settings.seed)
    )
    extra = {"token2wav_dtype": str(flow_dtype).removeprefix("torch."), "hift_dtype": "float32"}
    pipeline = CosyVoice2Pipeline(llm.prompter, llm.generate, token2wav, device, llm.max_seq_len)
    return pipeline, INPUT_SAMPLE_RATE, {**llm.report, **extra}
