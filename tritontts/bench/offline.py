"""A whole TTS pipeline in one process, no server, batch by batch, each stage timed on its own, for one LLM
backend at several batch sizes. The model's own parts live in `offline_spark`, `offline_cosyvoice2` and
`offline_cosyvoice2_dit`; this module holds what they share: settings, timing records, the LLM backends, the
batch loop and the report.

Backends: `torch` (our engine, all prompts of a batch in flight together), `hf` (transformers'
`Qwen2ForCausalLM.generate`, left-padded) and `trtllm` (TensorRT-LLM's `ModelRunnerCpp`). Each returns, per
prompt, the generated token ids without the end token. CosyVoice2 also has `openai` (alias `trtllm-serve`):
an OpenAI-compatible chat endpoint elsewhere (`offline_openai`).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import soundfile
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.durations import expected_tokens
from tritontts.devices import DTYPES, resolve_device
from tritontts.dsp.resample import resample
from tritontts.llm.config import Qwen2Config

BACKENDS = ("torch", "hf", "trtllm", "openai")
BACKEND_ALIASES = {"trtllm-serve": "openai"}
CHAT_BACKEND_MODELS = ("cosyvoice2", "cosyvoice2_dit")
"""the models whose LLM prompt the `openai` backend can send as chat messages"""
MODELS = ("spark_tts", "cosyvoice2", "cosyvoice2_dit")
TOKEN2WAV_DTYPES = ("auto", *DTYPES)
WARMUP_NOTE = (
    "before the measured pass of each batch size, its first batch is run once as a warm-up (CUDA graph "
    "capture, compilation, first-call costs); the warm-up is timed separately under `warmup` and excluded "
    "from every total; the measured pass then runs all rows, the first batch included"
)
MISSING_ENDPOINT = (
    "the openai backend needs --llm-endpoint URL, the /v1/chat/completions of an OpenAI-compatible LLM server "
    "(trtllm-serve, or python -m tritontts.llm.openai_server --model-dir <model-dir>/cosyvoice2_llm)"
)
TRTLLM_MISSING = (
    "tensorrt_llm.runtime.ModelRunnerCpp cannot be imported; the trtllm backend needs NVIDIA's TensorRT-LLM "
    "container (use --backend torch or hf here)"
)

# Prompts in, and for each prompt either None (stop at the end id or after max_new_tokens) or the exact
# number of tokens to generate; out, the generated ids of each prompt.
Generate = Callable[[list[np.ndarray], list[int | None]], list[list[int]]]


class BackendUnavailable(RuntimeError):
    """The backend's library cannot be imported here, or its server cannot be reached."""


class LLMEndpointError(RuntimeError):
    """The LLM endpoint answered, but not with a completion."""


def backend_name(name: str) -> str:
    """The backend an alias stands for (`trtllm-serve` is `openai`)."""
    return BACKEND_ALIASES.get(name, name)


@dataclass(frozen=True)
class Decoding:
    """What every backend samples with, and the ids that end and pad a sequence."""

    end_id: int
    pad_id: int
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.0

    def sampling(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
        }


@dataclass(frozen=True)
class OfflineSettings:
    model_dir: Path
    backend: str = "torch"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    max_new_tokens: int | None = None
    """None: the model's default (1500 for Spark-TTS, 750 for CosyVoice2, as upstream)"""
    realistic_lengths: bool = False
    seed: int = 0
    max_seq_len: int | None = None
    engine_dir: Path | None = None
    model: str = "spark_tts"
    token2wav_dtype: str = "auto"
    """cosyvoice2 flow: auto (float16 on CUDA as upstream, float32 on CPU) | float32 | float16 | bfloat16"""
    llm_endpoint: str | None = None
    """openai: the URL of `/v1/chat/completions`"""
    llm_model: str = "trt_engines_bfloat16"
    """openai: the request's `model` (upstream's trtllm-serve name)"""


@dataclass(frozen=True)
class StageNames:
    """How a model's report names its first and last stage and the tokens its decoder turns into audio."""

    front: str
    back: str
    speech_tokens: str


@dataclass
class StageTimes:
    """Seconds of one batch (or the sum over batches)."""

    rows: int = 0
    front_s: float = 0.0
    llm_s: float = 0.0
    back_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    speech_tokens: int = 0
    audio_s: float = 0.0

    def add(self, other: StageTimes) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)

    def named(self, names: StageNames) -> dict:
        return {
            "rows": self.rows,
            f"{names.front}_s": self.front_s,
            "llm_s": self.llm_s,
            f"{names.back}_s": self.back_s,
            "wall_s": self.wall_s,
            "tokens": self.tokens,
            names.speech_tokens: self.speech_tokens,
            "audio_s": self.audio_s,
        }


@dataclass(frozen=True)
class RowResult:
    id: str
    batch: int
    tokens: int
    speech_tokens: int
    forced_tokens: int | None
    audio_s: float
    wav: str

    def named(self, names: StageNames) -> dict:
        record = asdict(self)
        record[names.speech_tokens] = record.pop("speech_tokens")
        return record


class OfflinePipeline(Protocol):
    """One model's front end, LLM backend and decoder; `run_batch` does one batch and times its stages."""

    names: StageNames
    sample_rate: int
    """of the audio it returns"""
    token_rate: int
    """speech tokens per second of audio, for --realistic-lengths"""
    decoding: Decoding
    max_seq_len: int | None
    """None when the LLM runs elsewhere"""

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]: ...

    def speech_token_count(self, generated: list[int]) -> int: ...


@runtime_checkable
class WarmupAware(Protocol):
    """A pipeline that caches per reference voice forgets the warm-up's voices before the measured pass."""

    def after_warmup(self) -> None: ...


class RequestSeeds:
    """The sampling seed of each request in order, `seed * 1_000_003 + n` for the run's n-th request (warm-ups
    included), so that backends which see the same batches sample each row with the same seed."""

    def __init__(self, seed: int) -> None:
        self.base = seed * 1_000_003
        self.issued = 0

    def take(self, count: int) -> list[int]:
        first = self.base + self.issued
        self.issued += count
        return list(range(first, first + count))


@dataclass
class BatchSizeResult:
    batch_size: int
    batches: int
    totals: StageTimes
    warmup: StageTimes
    rows: list[RowResult] = field(default_factory=list)

    def summary(self, names: StageNames) -> dict:
        t = self.totals
        stages = {names.front: t.front_s, "llm": t.llm_s, names.back: t.back_s}
        return {
            "batch_size": self.batch_size,
            "rows": t.rows,
            "batches": self.batches,
            "wall_s": t.wall_s,
            "audio_s": t.audio_s,
            "rtf": t.wall_s / t.audio_s if t.audio_s > 0 else None,
            **{f"{name}_s": seconds for name, seconds in stages.items()},
            "share": {k: v / t.wall_s if t.wall_s > 0 else None for k, v in stages.items()},
            "tokens": t.tokens,
            names.speech_tokens: t.speech_tokens,
            "llm_tokens_per_s": t.tokens / t.llm_s if t.llm_s > 0 else None,
            "warmup": self.warmup.named(names),
            "records": [r.named(names) for r in self.rows],
        }


def resolve_dtype(name: str, device: torch.device, llm_dir: Path) -> torch.dtype:
    """`auto`: float32 on CPU, the LLM config's dtype elsewhere."""
    if name == "auto":
        name = (
            "float32" if device.type == "cpu" else Qwen2Config.from_file(llm_dir / "config.json").torch_dtype
        )
    return getattr(torch, name)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable, *args):
    """`fn(*args)` and its seconds, the device synchronized on both sides."""
    synchronize(device)
    start = time.perf_counter()
    out = fn(*args)
    synchronize(device)
    return out, time.perf_counter() - start


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def batches_of(items: Sequence, size: int) -> list[list]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def to_rate(rows: Sequence[Utterance], sample_rate: int) -> list[np.ndarray]:
    return [
        np.asarray(
            u.prompt_audio
            if u.sample_rate == sample_rate
            else resample(u.prompt_audio, u.sample_rate, sample_rate),
            dtype=np.float32,
        )
        for u in rows
    ]


def forced_token_counts(rows: Sequence[Utterance], realistic: bool, token_rate: int) -> list[int | None]:
    return [expected_tokens(u.target_text, token_rate) if realistic else None for u in rows]


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


def torch_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    max_new_tokens: int,
) -> Generate:
    from tritontts.llm.engine import LLMEngine
    from tritontts.llm.sequence import SamplingParams

    engine = LLMEngine.from_pretrained(
        llm_dir,
        device=device,
        dtype=dtype,
        max_batch_size=max(settings.batch_sizes),
        max_seq_len=max_seq_len,
        cuda_graphs=device.type == "cuda",
        compile=settings.compile,
    )
    seeds = RequestSeeds(settings.seed)

    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        params = [
            SamplingParams(
                max_tokens=n or max_new_tokens,
                min_tokens=n or 0,
                seed=seed,
                end_id=decoding.end_id,
                pad_id=decoding.pad_id,
                **decoding.sampling(),
            )
            for n, seed in zip(forced, seeds.take(len(forced)), strict=True)
        ]
        for prompt, p in zip(prompts, params, strict=True):
            if len(prompt) + p.max_tokens > max_seq_len:
                raise ValueError(
                    f"a prompt of {len(prompt)} tokens + {p.max_tokens} new ones exceeds max_seq_len "
                    f"{max_seq_len}; pass a larger --max-seq-len"
                )
        return engine.generate([p.tolist() for p in prompts], params)

    return generate


def _left_padded(
    prompts: list[np.ndarray], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.from_numpy(np.asarray(p, dtype=np.int64))
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _until_end(ids: list[int], end_id: int, limit: int | None) -> list[int]:
    ids = ids[: ids.index(end_id)] if end_id in ids else ids
    return ids[:limit] if limit is not None else ids


def hf_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_new_tokens: int,
) -> Generate:
    """Rows of a batch with fewer forced tokens than the batch's longest are generated as far as the longest
    (as `generate` does for every static batch) and cut to their own count."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(llm_dir), dtype=dtype).to(device).eval()
    if settings.compile:
        model.forward = torch.compile(model.forward)
    end_id, pad_id = decoding.end_id, decoding.pad_id

    @torch.inference_mode()
    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        ids, mask = _left_padded(prompts, pad_id, device)
        longest = max((n for n in forced if n is not None), default=None)
        lengths = {} if longest is None else {"min_new_tokens": longest}
        torch.manual_seed(settings.seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=longest or max_new_tokens,
            eos_token_id=end_id,
            pad_token_id=pad_id,
            **decoding.sampling(),
            **lengths,
        )
        new = out[:, ids.shape[1] :].tolist()
        return [_until_end(row, end_id, n) for row, n in zip(new, forced, strict=True)]

    return generate


def trtllm_available() -> bool:
    try:
        from tensorrt_llm.runtime import ModelRunnerCpp  # noqa: F401
    except ImportError:
        return False
    return True


def trtllm_backend(settings: OfflineSettings, decoding: Decoding, max_new_tokens: int) -> Generate:
    """Like `hf`, a batch runs as far as its longest forced count; rows are cut to their own."""
    if not trtllm_available():
        raise BackendUnavailable(TRTLLM_MISSING)
    if settings.engine_dir is None:
        raise ValueError("the trtllm backend needs --engine-dir (the output of trtllm-build)")
    from tensorrt_llm.runtime import ModelRunnerCpp

    runner = ModelRunnerCpp.from_dir(
        engine_dir=str(settings.engine_dir), max_batch_size=max(settings.batch_sizes)
    )
    end_id, pad_id = decoding.end_id, decoding.pad_id

    @torch.inference_mode()
    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        longest = max((n for n in forced if n is not None), default=None)
        out = runner.generate(
            batch_input_ids=[torch.from_numpy(np.asarray(p, dtype=np.int32)) for p in prompts],
            max_new_tokens=longest or max_new_tokens,
            min_length=longest or 1,
            end_id=end_id,
            pad_id=pad_id,
            random_seed=settings.seed,
            return_dict=True,
            output_sequence_lengths=True,
            **decoding.sampling(),
        )
        ids, lengths = out["output_ids"], out["sequence_lengths"]
        rows = [ids[i, 0, len(p) : int(lengths[i, 0])].tolist() for i, p in enumerate(prompts)]
        return [_until_end(row, end_id, n) for row, n in zip(rows, forced, strict=True)]

    return generate


def llm_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    max_new_tokens: int,
) -> Generate:
    if settings.backend == "torch":
        return torch_backend(settings, llm_dir, decoding, device, dtype, max_seq_len, max_new_tokens)
    if settings.backend == "hf":
        return hf_backend(settings, llm_dir, decoding, device, dtype, max_new_tokens)
    if settings.backend == "trtllm":
        return trtllm_backend(settings, decoding, max_new_tokens)
    raise ValueError(f"backend {settings.backend!r} does not take prompt ids")


def environment(
    settings: OfflineSettings, pipeline: OfflinePipeline, device: torch.device, extra: dict
) -> dict:
    names = pipeline.names
    return {
        "model": settings.model,
        "backend": settings.backend,
        "device": str(device),
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        **extra,
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
            "max_seq_len": pipeline.max_seq_len,
            "sampling": pipeline.decoding.sampling(),
            "token_rate": pipeline.token_rate,
            "sample_rate": pipeline.sample_rate,
        },
        "stages": [names.front, "llm", names.back],
        "timing": (
            f"wall_s: a batch from its {names.front} call to its last {names.back} sample (prompt building "
            "included, WAV writing excluded), torch.cuda.synchronize() around every stage on CUDA; rtf = "
            "wall_s / audio_s; llm_tokens_per_s = tokens / llm_s. With --realistic-lengths, the hf and trtllm "
            "backends run every row of a batch to the batch's largest forced count (static batching) and cut "
            "each row to its own; tokens counts only the rows' own tokens. openai: one non-streamed HTTP "
            "request per row, all rows of a batch in flight together; llm_s is the batch's wall time from the "
            "first request sent to the last reply parsed, tokens the <|s_N|> tokens of the replies"
        ),
        "warmup_note": WARMUP_NOTE,
    }


def run_offline(settings: OfflineSettings, rows: Sequence[Utterance], log_dir: Path) -> dict:
    """Every batch size over `rows`; writes WAVs under `log_dir/<backend>_bs<N>/`, returns the report dict."""
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
    if not rows:
        raise ValueError("no rows to synthesize")
    device = resolve_device(settings.device)
    if settings.model == "spark_tts":
        from tritontts.bench.offline_spark import create_pipeline
    elif settings.model == "cosyvoice2":
        from tritontts.bench.offline_cosyvoice2 import create_pipeline
    else:
        from tritontts.bench.offline_cosyvoice2_dit import create_pipeline
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


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _title(stage: str) -> str:
    return {"frontend": "Front end", "token2wav": "Token2wav"}.get(stage, stage.capitalize())


def markdown_table(report: dict) -> str:
    front, _, back = report["stages"]
    columns = (
        "Backend",
        "Batch size",
        "Rows",
        "Audio s",
        "Wall s",
        "RTF",
        f"{_title(front)} s",
        "LLM s",
        f"{_title(back)} s",
        "LLM tok/s",
    )
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in report["results"]:
        cells = (
            report["backend"],
            str(r["batch_size"]),
            str(r["rows"]),
            _num(r["audio_s"], 2),
            _num(r["wall_s"]),
            _num(r["rtf"], 4),
            _num(r[f"{front}_s"]),
            _num(r["llm_s"]),
            _num(r[f"{back}_s"]),
            _num(r["llm_tokens_per_s"], 1),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, log_dir: Path) -> dict[str, Path]:
    """`offline_<backend>.json` and `.md` (Spark-TTS), `offline_<model>_<backend>.*` for other models."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    model = report.get("model", "spark_tts")
    stem = f"offline_{report['backend']}" if model == "spark_tts" else f"offline_{model}_{report['backend']}"
    paths = {"json": log_dir / f"{stem}.json", "markdown": log_dir / f"{stem}.md"}
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(markdown_table(report))
    return paths
