"""The standalone token2wav benchmark: speech tokens → audio for every dataset row, with no LLM and no server.

Each row's target tokens are its `target_audio_cosy2_tokens` (the seed_tts_cosy2 schema: tokens of the recorded
target, as upstream's token2wav benchmarks read them) or, for rows without them, random speech ids (seeded per
row) as many as the target text takes to say at 25 tokens per second. A row's speaker is prepared from its
prompt audio at 16 kHz once per distinct prompt and mode, and timed apart from token2wav.

`offline` makes one offline call per row. `streaming` makes the calls the Triton BLS makes once all tokens
have arrived (`StreamSchedule.plan`), each timed. Every call is timed with the device synchronized on both
sides. The first `warmup` rows are first run once in each mode; that pass is timed apart and not counted.
"""

from __future__ import annotations

import json
import platform
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.durations import expected_tokens
from tritontts.bench.offline_pipeline import to_rate
from tritontts.bench.offline_timing import device_name, synchronize, timed
from tritontts.bench.report import markdown_table as latency_table
from tritontts.bench.stats import BenchmarkRun, LatencyStats, RequestRecord
from tritontts.bench.token2wav_models import SAMPLE_RATE, Token2WavModel, load_model
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cuda_graphs import flow_graph_config
from tritontts.devices import resolve_device, resolve_flow_dtype
from tritontts.voice_cache import audio_key

MODES = ("offline", "streaming")
STRATEGIES = ("exponential", "fixed")  # time_based needs an LLM's timing: not here
TOKEN_RATE = 25
PROMPT_RATE = 16000
TIMING_NOTE = (
    "latency: one offline call, or a stream from the start of its first call to the end of its last; every "
    "call has torch.cuda.synchronize() on both sides on CUDA; first_chunk_latency: the stream's first call; "
    "rtf = compute_s / audio_s, compute_s being the sum of the rows' latencies (speaker preparation excluded, "
    "timed under `speakers`); the warm-up pass is timed under `warmup` and excluded from everything else"
)


@dataclass(frozen=True)
class Target:
    id: str
    prompt_wav: np.ndarray
    """16 kHz"""
    speaker_key: str
    tokens: np.ndarray
    """int64 speech token ids"""
    source: str
    """dataset | synthetic"""


@dataclass
class RowRecord:
    id: str
    tokens: int
    tokens_source: str
    latency: float
    samples: int
    audio_s: float
    speaker_s: float | None
    """the preparation of this row's speaker, when this row was the first of its prompt"""
    first_chunk_latency: float | None = None
    chunk_latencies: list[float] = field(default_factory=list)
    chunk_samples: list[int] = field(default_factory=list)
    wav: str | None = None

    @property
    def chunks(self) -> int:
        return len(self.chunk_latencies)

    @property
    def rtf(self) -> float | None:
        return self.latency / self.audio_s if self.audio_s > 0 else None

    def to_dict(self) -> dict:
        return asdict(self) | {"chunks": self.chunks, "rtf": self.rtf}


@dataclass(frozen=True)
class BenchSettings:
    model: str
    model_dir: Path
    modes: tuple[str, ...] = MODES
    strategy: str = "exponential"
    token_hop_len: int = 15
    pre_lookahead_len: int = 3
    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: str = "auto"
    warmup: int = 2
    seed: int = 0
    save_wavs: bool = False

    def schedule(self) -> StreamSchedule:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.token_hop_len < 1 or self.pre_lookahead_len < 0:
            raise ValueError(
                f"token_hop_len must be >= 1 and pre_lookahead_len >= 0, got {self.token_hop_len} "
                f"and {self.pre_lookahead_len}"
            )
        return StreamSchedule(
            token_hop_len=self.token_hop_len,
            pre_lookahead_len=self.pre_lookahead_len,
            exponential=self.strategy == "exponential",
            token_frame_rate=TOKEN_RATE,
        )


def synthetic_tokens(text: str, vocab_size: int, seed: int, index: int) -> np.ndarray:
    count = expected_tokens(text, TOKEN_RATE)
    return np.random.default_rng([seed, index]).integers(0, vocab_size, count, dtype=np.int64)


def targets_of(rows: Sequence[Utterance], vocab_size: int, seed: int) -> list[Target]:
    """Every row's prompt at 16 kHz and its target tokens (the dataset's, else synthetic)."""
    targets = []
    for index, (row, wav) in enumerate(zip(rows, to_rate(rows, PROMPT_RATE), strict=True)):
        if row.target_tokens is None:
            tokens, source = synthetic_tokens(row.target_text, vocab_size, seed, index), "synthetic"
        else:
            tokens, source = row.target_tokens.astype(np.int64), "dataset"
            if tokens.size == 0:
                raise ValueError(f"row {row.id}: target_audio_cosy2_tokens is empty")
            if tokens.min() < 0 or tokens.max() >= vocab_size:
                raise ValueError(
                    f"row {row.id}: target_audio_cosy2_tokens holds ids outside [0, {vocab_size})"
                )
        targets.append(Target(row.id, wav, audio_key(wav, PROMPT_RATE), tokens, source))
    return targets


def tokens_label(targets: Sequence[Target]) -> str:
    sources = {t.source for t in targets}
    return sources.pop() if len(sources) == 1 else "mixed"


def run_offline_row(model: Token2WavModel, target: Target, speaker: Any) -> tuple[np.ndarray, dict]:
    audio, seconds = timed(model.device, model.offline, target.tokens, speaker)
    return audio, {"latency": seconds}


def run_stream_row(
    model: Token2WavModel, target: Target, speaker: Any, schedule: StreamSchedule, request_id: str
) -> tuple[np.ndarray, dict]:
    pieces, latencies = [], []
    synchronize(model.device)
    start = time.perf_counter()
    for chunk in schedule.plan(len(target.tokens)):
        piece, seconds = timed(model.device, model.stream, request_id, target.tokens, chunk, speaker)
        pieces.append(piece)
        latencies.append(seconds)
    latency = time.perf_counter() - start
    timing = {
        "latency": latency,
        "first_chunk_latency": latencies[0],
        "chunk_latencies": latencies,
        "chunk_samples": [len(p) for p in pieces],
    }
    return np.concatenate(pieces), timing


def run_row(
    model: Token2WavModel, mode: str, target: Target, speaker: Any, schedule: StreamSchedule, request_id: str
) -> tuple[np.ndarray, dict]:
    if mode == "offline":
        return run_offline_row(model, target, speaker)
    return run_stream_row(model, target, speaker, schedule, request_id)


@dataclass
class ModeResult:
    mode: str
    records: list[RowRecord]
    speaker_seconds: list[float]


def run_mode(
    model: Token2WavModel,
    mode: str,
    targets: Sequence[Target],
    schedule: StreamSchedule,
    wav_dir: Path | None,
) -> ModeResult:
    """One measured pass. A speaker is prepared at the first row of its prompt, dropped after the last."""
    remaining = Counter(t.speaker_key for t in targets)
    speakers: dict[str, Any] = {}
    result = ModeResult(mode, [], [])
    for target in targets:
        speaker_s = None
        if target.speaker_key not in speakers:
            speakers[target.speaker_key], speaker_s = timed(model.device, model.prepare, target.prompt_wav)
            result.speaker_seconds.append(speaker_s)
        speaker = speakers[target.speaker_key]
        audio, timing = run_row(model, mode, target, speaker, schedule, f"{mode}-{target.id}")
        remaining[target.speaker_key] -= 1
        if not remaining[target.speaker_key]:
            del speakers[target.speaker_key]
        wav = None
        if wav_dir is not None:
            wav_dir.mkdir(parents=True, exist_ok=True)
            wav = str(wav_dir / f"{target.id}.wav")
            soundfile.write(wav, audio, SAMPLE_RATE)
        result.records.append(
            RowRecord(
                id=target.id,
                tokens=len(target.tokens),
                tokens_source=target.source,
                samples=len(audio),
                audio_s=len(audio) / SAMPLE_RATE,
                speaker_s=speaker_s,
                wav=wav,
                **timing,
            )
        )
    return result


def warm_up(
    model: Token2WavModel, modes: Sequence[str], targets: Sequence[Target], schedule: StreamSchedule
) -> dict:
    """Each mode once over `targets` (speakers prepared per row), timed as a whole; nothing is kept."""
    synchronize(model.device)
    start = time.perf_counter()
    for mode in modes:
        for target in targets:
            speaker = model.prepare(target.prompt_wav)
            run_row(model, mode, target, speaker, schedule, f"warmup-{mode}-{target.id}")
    synchronize(model.device)
    return {"rows": len(targets), "ids": [t.id for t in targets], "seconds": time.perf_counter() - start}


def _stats(values: Sequence[float]) -> dict | None:
    stats = LatencyStats.of(values)
    return None if stats is None else asdict(stats)


def summary_of(result: ModeResult) -> dict:
    records = result.records
    compute = sum(r.latency for r in records)
    audio = sum(r.audio_s for r in records)
    streaming = result.mode == "streaming"
    return {
        "rows": len(records),
        "tokens": sum(r.tokens for r in records),
        "audio_s": audio,
        "compute_s": compute,
        "rtf": compute / audio if audio > 0 else None,
        "latency": _stats([r.latency for r in records]),
        "first_chunk_latency": _stats([r.first_chunk_latency for r in records]) if streaming else None,
        "chunk_latency": _stats([s for r in records for s in r.chunk_latencies]) if streaming else None,
        "chunks": sum(r.chunks for r in records) if streaming else None,
        "speakers": {"prepared": len(result.speaker_seconds), "latency": _stats(result.speaker_seconds)},
    }


def latency_run(report: dict) -> BenchmarkRun:
    """A mode's report as the other benchmarks' run type: one request at a time, wall = compute seconds."""
    records = [
        RequestRecord(r["id"], r["latency"], r["audio_s"], r["first_chunk_latency"], r["chunks"])
        for r in report["records"]
    ]
    return BenchmarkRun(report["mode"], 1, report["summary"]["compute_s"], records)


def run_benchmark(settings: BenchSettings, rows: Sequence[Utterance], log_dir: Path) -> list[dict]:
    """Warm-up, then one measured pass per mode; returns one report per mode (see `report_of`)."""
    unknown = [m for m in settings.modes if m not in MODES]
    if unknown or not settings.modes:
        raise ValueError(f"modes must be some of {MODES}, got {list(settings.modes)}")
    if not rows:
        raise ValueError("no rows to synthesize")
    if settings.warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {settings.warmup}")
    schedule = settings.schedule()
    device = resolve_device(settings.device)
    dtype = resolve_flow_dtype(settings.dtype, device)
    graphs = flow_graph_config(settings.cuda_graphs, "1", device)
    model = load_model(settings.model, settings.model_dir, device, dtype, settings.seed, graphs)
    if "streaming" in settings.modes and model.pre_lookahead_len != settings.pre_lookahead_len:
        raise ValueError(
            f"pre_lookahead_len {settings.pre_lookahead_len} differs from the model's "
            f"{model.pre_lookahead_len}; pass --pre-lookahead-len {model.pre_lookahead_len}"
        )
    targets = targets_of(rows, model.vocab_size, settings.seed)
    with torch.inference_mode():
        warmup = warm_up(model, settings.modes, targets[: settings.warmup], schedule)
        results = []
        for mode in settings.modes:
            wav_dir = Path(log_dir) / f"{settings.model}_{mode}" if settings.save_wavs else None
            results.append(run_mode(model, mode, targets, schedule, wav_dir))
    environment = {
        "model": settings.model,
        "device": str(device),
        "device_name": device_name(device),
        "dtype": str(dtype).removeprefix("torch."),
        "cuda_graphs": graphs is not None,
        "hift_dtype": "float32",
        "torch_version": torch.__version__,
        "platform": platform.platform(),
        "tokens": tokens_label(targets),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(settings).items()}
        | {"token_rate": TOKEN_RATE, "sample_rate": SAMPLE_RATE, "schedule": asdict(schedule)},
        "timing": TIMING_NOTE,
        "warmup": warmup,
    }
    return [report_of(environment, result) for result in results]


def report_of(environment: dict, result: ModeResult) -> dict:
    return {
        **environment,
        "mode": result.mode,
        "summary": summary_of(result),
        "records": [r.to_dict() for r in result.records],
    }


def markdown(report: dict) -> str:
    """A line naming the model, device and token source, then the other benchmarks' latency table."""
    speakers = report["summary"]["speakers"]
    prepared = speakers["latency"]
    speaker_text = "" if prepared is None else f", avg {prepared['avg'] * 1000:.2f} ms each"
    return (
        f"token2wav {report['model']}, {report['mode']}: {report['device_name']} ({report['dtype']}), "
        f"tokens: {report['tokens']}, speakers prepared: {speakers['prepared']}{speaker_text}\n\n"
        f"{latency_table([latency_run(report)])}"
    )


def write_report(report: dict, log_dir: Path) -> dict[str, Path]:
    """`token2wav_<model>_<mode>.json` and `.md` in `log_dir`."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = f"token2wav_{report['model']}_{report['mode']}"
    paths = {"json": log_dir / f"{stem}.json", "markdown": log_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(markdown(report))
    return paths
