"""A whole TTS pipeline in one process, no server, batch by batch, each stage timed on its own, for one LLM
backend at several batch sizes: the runner, on top of the rest of the offline benchmark.

Layers, each importing only those below it: `offline_settings` and `offline_results` (the shared types);
`offline_timing` and `offline_pipeline` (stage timing, the pipeline protocol and its inputs); `offline_llm`
(the in-process LLM backends), `offline_cosyvoice2_prompt` and `offline_openai` (the chat backend); the model
pipelines `offline_spark`, `offline_cosyvoice2` and `offline_cosyvoice2_dit`; `offline_report`; this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import soundfile
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_llm import TRTLLM_MISSING, trtllm_available
from tritontts.bench.offline_pipeline import OfflinePipeline, WarmupAware, forced_token_counts, to_rate
from tritontts.bench.offline_report import environment
from tritontts.bench.offline_results import BatchSizeResult, RowResult, StageTimes
from tritontts.bench.offline_settings import (
    BACKENDS,
    CHAT_BACKEND_MODELS,
    MISSING_ENDPOINT,
    MODELS,
    BackendUnavailable,
    OfflineSettings,
    backend_name,
)
from tritontts.devices import resolve_device


def checked(settings: OfflineSettings) -> OfflineSettings:
    """The settings with the backend's alias resolved; raises when the model, backend and endpoint do not fit."""
    settings = replace(settings, backend=backend_name(settings.backend))
    if settings.model not in MODELS:
        raise ValueError(f"unknown model {settings.model!r}; choose from {MODELS}")
    if settings.backend not in BACKENDS:
        raise ValueError(f"unknown backend {settings.backend!r}; choose from {BACKENDS}")
    if settings.backend == "openai":
        if settings.model not in CHAT_BACKEND_MODELS:
            raise ValueError(
                f"the openai backend sends CosyVoice2's chat prompt; --model {settings.model} takes "
                "torch, hf or trtllm"
            )
        if not settings.llm_endpoint:
            raise ValueError(MISSING_ENDPOINT)
    if settings.backend == "trtllm" and not trtllm_available():
        raise BackendUnavailable(TRTLLM_MISSING)
    return settings


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[OfflinePipeline, int, dict]:
    """The model's pipeline, the rate its reference audio is read at, and what the report says about its dtypes;
    only the chosen model's modules are imported."""
    if settings.model == "spark_tts":
        from tritontts.bench.offline_spark import create_pipeline
    elif settings.model == "cosyvoice2":
        from tritontts.bench.offline_cosyvoice2 import create_pipeline
    elif settings.model == "cosyvoice3":
        from tritontts.bench.offline_cosyvoice3 import create_pipeline
    else:
        from tritontts.bench.offline_cosyvoice2_dit import create_pipeline
    return create_pipeline(settings, rows, device)


def batches_of(items: Sequence, size: int) -> list[list]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def run_batch_size(
    pipeline: OfflinePipeline,
    rows: Sequence[Utterance],
    wavs: Sequence[np.ndarray],
    batch_size: int,
    forced: Sequence[int | None],
    wav_dir: Path,
) -> BatchSizeResult:
    indices = batches_of(range(len(rows)), batch_size)
    first = indices[0]
    _, _, warmup = pipeline.run_batch(
        [rows[i] for i in first], [wavs[i] for i in first], [forced[i] for i in first]
    )
    if isinstance(pipeline, WarmupAware):
        pipeline.after_warmup()
    result = BatchSizeResult(batch_size, len(indices), StageTimes(), warmup)
    wav_dir.mkdir(parents=True, exist_ok=True)
    for number, batch in enumerate(indices):
        batch_rows = [rows[i] for i in batch]
        audio, generated, times = pipeline.run_batch(
            batch_rows, [wavs[i] for i in batch], [forced[i] for i in batch]
        )
        result.totals.add(times)
        for i, u, wav, ids in zip(batch, batch_rows, audio, generated, strict=True):
            path = wav_dir / f"{u.id}.wav"
            soundfile.write(path, wav, pipeline.sample_rate)
            result.rows.append(
                RowResult(
                    id=u.id,
                    batch=number,
                    tokens=len(ids),
                    speech_tokens=pipeline.speech_token_count(ids),
                    forced_tokens=forced[i],
                    audio_s=len(wav) / pipeline.sample_rate,
                    wav=str(path),
                )
            )
    return result


def run_offline(settings: OfflineSettings, rows: Sequence[Utterance], log_dir: Path) -> dict:
    """Every batch size over `rows`; writes WAVs under `log_dir/<backend>_bs<N>/`, returns the report dict."""
    settings = checked(settings)
    if not rows:
        raise ValueError("no rows to synthesize")
    device = resolve_device(settings.device)
    pipeline, input_rate, extra = create_pipeline(settings, rows, device)
    wavs = to_rate(rows, input_rate)
    forced = forced_token_counts(rows, settings.realistic_lengths, pipeline.token_rate)
    results = [
        run_batch_size(pipeline, rows, wavs, bs, forced, Path(log_dir) / f"{settings.backend}_bs{bs}")
        for bs in settings.batch_sizes
    ]
    return {
        **environment(settings, pipeline, device, extra),
        "results": [r.summary(pipeline.names) for r in results],
    }
