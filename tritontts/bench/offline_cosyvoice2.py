"""CosyVoice2 in one process: front end (speech tokenizer v2, 24 kHz prompt mel, CAMPPlus) → LLM → token2wav
(flow + HiFT), batch by batch.

`--model-dir` is the folder holding `CosyVoice2-0.5B/` and `cosyvoice2_llm/` (what run.sh stage 0 writes). The
front end runs one reference at a time, the LLM all prompts of a batch together, token2wav one row at a time
(offline, as upstream's `token2wav_batch_size=1`). Generated ids that are not speech tokens are dropped, as
upstream's offline script drops them when it decodes the text.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline import (
    TOKEN2WAV_DTYPES,
    Decoding,
    Generate,
    OfflineSettings,
    StageNames,
    StageTimes,
    forced_token_counts,
    llm_backend,
    resolve_dtype,
    synchronize,
    timed,
)
from tritontts.cosyvoice2.frontend import INPUT_SAMPLE_RATE, CosyVoice2Frontend, PromptFeatures
from tritontts.cosyvoice2.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice2.prompt import UPSTREAM_DECODING, CosyVoice2Prompt
from tritontts.cosyvoice2.token2wav import Token2Wav

NAMES = StageNames(front="frontend", back="token2wav", speech_tokens="speech_tokens")
SAMPLE_RATE = 24000
TOKEN_RATE = 25
MAX_NEW_TOKENS = UPSTREAM_DECODING.max_tokens


def resolve_token2wav_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: float16 on CUDA (upstream runs the flow in fp16), float32 on CPU."""
    if name not in TOKEN2WAV_DTYPES:
        raise ValueError(f"token2wav dtype must be one of {TOKEN2WAV_DTYPES}, got {name!r}")
    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def frontend_device(device: torch.device) -> str:
    """The speech tokenizer runs on the GPU when onnxruntime can (CAMPPlus stays on CPU, as upstream)."""
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        return "cuda" if device.index is None else f"cuda:{device.index}"
    return "cpu"


def plan_max_seq_len(rows: Sequence[Utterance], prompter: CosyVoice2Prompt, max_new_tokens: int) -> int:
    """Room for the longest prompt (its text, 25 speech tokens per second of reference, some slack) plus the
    generated tokens, rounded up to 256."""
    longest = 0
    for u in rows:
        text = len(prompter.tokenizer.encode(u.prompt_text + u.target_text).ids)
        reference = len(u.prompt_audio) * TOKEN_RATE // u.sample_rate + 2
        longest = max(longest, text + reference + 8)
    return -(-(longest + max_new_tokens) // 256) * 256


class CosyVoice2Pipeline:
    names = NAMES
    sample_rate = SAMPLE_RATE
    token_rate = TOKEN_RATE

    def __init__(
        self,
        frontend: CosyVoice2Frontend,
        prompter: CosyVoice2Prompt,
        generate: Generate,
        token2wav: Token2Wav,
        device: torch.device,
        max_seq_len: int,
    ) -> None:
        self.frontend = frontend
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

    def _vocode(self, tokens: list[int], voice: PromptFeatures) -> np.ndarray:
        audio = self.token2wav.offline(
            torch.tensor([tokens], dtype=torch.int32),
            torch.from_numpy(voice.speech_tokens[None]),
            torch.from_numpy(voice.speech_feat[None]),
            torch.from_numpy(voice.spk_embedding[None]),
        )
        return audio[0].float().cpu().numpy()

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]:
        synchronize(self.device)
        start = time.perf_counter()
        voices, frontend_s = timed(self.device, lambda: [self.frontend(w) for w in wavs])
        prompts = [
            np.asarray(self.prompter.input_ids(u.prompt_text, u.target_text, v.speech_tokens), dtype=np.int32)
            for u, v in zip(rows, voices, strict=True)
        ]
        generated, llm_s = timed(self.device, self.generate, prompts, list(forced))
        speech = [self.speech_tokens(ids) for ids in generated]
        audio = [np.zeros(0, dtype=np.float32) for _ in rows]
        token2wav_s = 0.0
        for i, tokens in enumerate(speech):
            if tokens:
                audio[i], seconds = timed(self.device, self._vocode, tokens, voices[i])
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


def decoding_of(prompter: CosyVoice2Prompt) -> Decoding:
    """Upstream's sampling (T 0.8, top-k 50, top-p 0.95, repetition penalty 1.1), ending and padding at
    `<|eos1|>`."""
    d = UPSTREAM_DECODING
    return Decoding(
        end_id=prompter.ids.end,
        pad_id=prompter.ids.end,
        temperature=d.temperature,
        top_k=d.top_k,
        top_p=d.top_p,
        repetition_penalty=d.repetition_penalty,
    )


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[CosyVoice2Pipeline, int, dict]:
    """The pipeline, the rate its reference audio is read at, and what the report says about its dtypes."""
    root = Path(settings.model_dir)
    llm_dir, model_dir = root / LLM_DIR, root / MODEL_DIR
    for folder in (llm_dir, model_dir):
        if not folder.is_dir():
            raise FileNotFoundError(
                f"{folder} not found: --model-dir must hold {MODEL_DIR}/ and {LLM_DIR}/ (run.sh stage 0 writes both)"
            )
    dtype = resolve_dtype(settings.dtype, device, llm_dir)
    flow_dtype = resolve_token2wav_dtype(settings.token2wav_dtype, device)
    prompter = CosyVoice2Prompt.from_llm_dir(llm_dir)
    max_new_tokens = settings.max_new_tokens or MAX_NEW_TOKENS
    forced = forced_token_counts(rows, settings.realistic_lengths, TOKEN_RATE)
    most = max((n for n in forced if n is not None), default=max_new_tokens)
    max_seq_len = settings.max_seq_len or plan_max_seq_len(rows, prompter, most)
    frontend = CosyVoice2Frontend.from_model_dir(model_dir, tokenizer_device=frontend_device(device))
    token2wav = Token2Wav.from_model_dir(model_dir, device, flow_dtype, seed=settings.seed)
    generate = llm_backend(
        settings, llm_dir, decoding_of(prompter), device, dtype, max_seq_len, max_new_tokens
    )
    extra = {
        "dtype": str(dtype).removeprefix("torch."),
        "token2wav_dtype": str(flow_dtype).removeprefix("torch."),
        "hift_dtype": "float32",
    }
    pipeline = CosyVoice2Pipeline(frontend, prompter, generate, token2wav, device, max_seq_len)
    return pipeline, INPUT_SAMPLE_RATE, extra
