"""The whole Spark-TTS pipeline in one process, no server: audio tokenizer → LLM → vocoder, batch by batch,
each stage timed on its own, for one LLM backend at several batch sizes.

Backends: `torch` (our engine, all prompts of a batch in flight together), `hf` (transformers'
`Qwen2ForCausalLM.generate`, left-padded) and `trtllm` (TensorRT-LLM's `ModelRunnerCpp`). Each returns, per
prompt, the generated token ids without the end token.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import soundfile
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.durations import expected_tokens
from tritontts.dsp.resample import resample
from tritontts.llm.config import Qwen2Config
from tritontts.spark.codec import SparkCodec, resolve_device
from tritontts.spark.service import SAMPLE_RATE, TOKEN_RATE, SparkPrompter

BACKENDS = ("torch", "hf", "trtllm")
TEMPERATURE, TOP_K, TOP_P = 0.8, 50, 0.95
TABLE_COLUMNS = (
    "Backend",
    "Batch size",
    "Rows",
    "Audio s",
    "Wall s",
    "RTF",
    "Tokenizer s",
    "LLM s",
    "Vocoder s",
    "LLM tok/s",
)
WARMUP_NOTE = (
    "before the measured pass of each batch size, its first batch is run once as a warm-up (CUDA graph "
    "capture, compilation, first-call costs); the warm-up is timed separately under `warmup` and excluded "
    "from every total; the measured pass then runs all rows, the first batch included"
)
TRTLLM_MISSING = (
    "tensorrt_llm.runtime.ModelRunnerCpp cannot be imported; the trtllm backend needs NVIDIA's TensorRT-LLM "
    "container (use --backend torch or hf here)"
)

# Prompts in, and for each prompt either None (stop at the end id or after max_new_tokens) or the exact
# number of tokens to generate; out, the generated ids of each prompt.
Generate = Callable[[list[np.ndarray], list[int | None]], list[list[int]]]


class BackendUnavailable(RuntimeError):
    """The backend's library cannot be imported here."""


@dataclass(frozen=True)
class OfflineSettings:
    model_dir: Path
    backend: str = "torch"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = False
    max_new_tokens: int = 1500
    realistic_lengths: bool = False
    seed: int = 0
    max_seq_len: int | None = None
    engine_dir: Path | None = None

    @property
    def llm_dir(self) -> Path:
        return Path(self.model_dir) / "LLM"


@dataclass
class StageTimes:
    """Seconds of one batch (or the sum over batches)."""

    rows: int = 0
    tokenizer_s: float = 0.0
    llm_s: float = 0.0
    vocoder_s: float = 0.0
    wall_s: float = 0.0
    tokens: int = 0
    semantic_tokens: int = 0
    audio_s: float = 0.0

    def add(self, other: StageTimes) -> None:
        for name, value in asdict(other).items():
            setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class RowResult:
    id: str
    batch: int
    tokens: int
    semantic_tokens: int
    forced_tokens: int | None
    audio_s: float
    wav: str


@dataclass
class BatchSizeResult:
    batch_size: int
    batches: int
    totals: StageTimes
    warmup: StageTimes
    rows: list[RowResult] = field(default_factory=list)

    def summary(self) -> dict:
        t = self.totals
        stages = {"tokenizer": t.tokenizer_s, "llm": t.llm_s, "vocoder": t.vocoder_s}
        return {
            "batch_size": self.batch_size,
            "rows": t.rows,
            "batches": self.batches,
            "wall_s": t.wall_s,
            "audio_s": t.audio_s,
            "rtf": t.wall_s / t.audio_s if t.audio_s > 0 else None,
            "tokenizer_s": t.tokenizer_s,
            "llm_s": t.llm_s,
            "vocoder_s": t.vocoder_s,
            "share": {k: v / t.wall_s if t.wall_s > 0 else None for k, v in stages.items()},
            "tokens": t.tokens,
            "semantic_tokens": t.semantic_tokens,
            "llm_tokens_per_s": t.tokens / t.llm_s if t.llm_s > 0 else None,
            "warmup": asdict(self.warmup),
            "records": [asdict(r) for r in self.rows],
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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def batches_of(items: Sequence, size: int) -> list[list]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def to_model_rate(rows: Sequence[Utterance]) -> list[np.ndarray]:
    return [
        np.asarray(
            u.prompt_audio
            if u.sample_rate == SAMPLE_RATE
            else resample(u.prompt_audio, u.sample_rate, SAMPLE_RATE),
            dtype=np.float32,
        )
        for u in rows
    ]


def forced_token_counts(rows: Sequence[Utterance], realistic: bool) -> list[int | None]:
    return [expected_tokens(u.target_text, TOKEN_RATE) if realistic else None for u in rows]


def plan_max_seq_len(rows: Sequence[Utterance], prompter: SparkPrompter, max_new_tokens: int) -> int:
    """Room for the longest prompt (text + 34 markers and global tokens + one semantic token per 320
    samples of reference audio, with some slack) plus the generated tokens, rounded up to 256."""
    longest = 0
    for u in rows:
        text = len(prompter.tokenizer.encode(u.prompt_text + u.target_text, add_special_tokens=False).ids)
        reference = len(u.prompt_audio) * SAMPLE_RATE // (u.sample_rate * 320) + 2
        longest = max(longest, text + reference + 40)
    return -(-(longest + max_new_tokens) // 256) * 256


class Pipeline:
    """Codec, prompter and one LLM backend; `run_batch` does one batch and times its stages."""

    def __init__(self, codec: SparkCodec, prompter: SparkPrompter, generate: Generate) -> None:
        self.codec = codec
        self.prompter = prompter
        self.generate = generate
        self.device = codec.device

    def _timed(self, fn, *args):
        synchronize(self.device)
        start = time.perf_counter()
        out = fn(*args)
        synchronize(self.device)
        return out, time.perf_counter() - start

    def run_batch(
        self, rows: Sequence[Utterance], wavs: Sequence[np.ndarray], forced: Sequence[int | None]
    ) -> tuple[list[np.ndarray], list[list[int]], StageTimes]:
        synchronize(self.device)
        start = time.perf_counter()
        voices, tokenizer_s = self._timed(self.codec.tokenize, list(wavs))
        prompts = [
            self.prompter.prompt_ids(u.prompt_text, u.target_text, v)
            for u, v in zip(rows, voices, strict=True)
        ]
        generated, llm_s = self._timed(self.generate, prompts, list(forced))
        semantic = [self.prompter.ids.semantic_ids(ids) for ids in generated]
        speaking = [i for i, s in enumerate(semantic) if s]
        audio = [np.zeros(0, dtype=np.float32) for _ in rows]
        vocoder_s = 0.0
        if speaking:
            globals_ = [voices[i].global_tokens for i in speaking]
            semantics = [np.asarray(semantic[i], dtype=np.int64) for i in speaking]
            vocoded, vocoder_s = self._timed(self.codec.detokenize, globals_, semantics)
            for i, wav in zip(speaking, vocoded, strict=True):
                audio[i] = wav
        synchronize(self.device)
        times = StageTimes(
            rows=len(rows),
            tokenizer_s=tokenizer_s,
            llm_s=llm_s,
            vocoder_s=vocoder_s,
            wall_s=time.perf_counter() - start,
            tokens=sum(len(g) for g in generated),
            semantic_tokens=sum(len(s) for s in semantic),
            audio_s=sum(len(a) for a in audio) / self.codec.sample_rate,
        )
        return audio, generated, times


def run_batch_size(
    pipeline: Pipeline,
    rows: Sequence[Utterance],
    batch_size: int,
    forced: Sequence[int | None],
    wav_dir: Path,
) -> BatchSizeResult:
    wavs = to_model_rate(rows)
    indices = batches_of(range(len(rows)), batch_size)
    first = indices[0]
    _, _, warmup = pipeline.run_batch(
        [rows[i] for i in first], [wavs[i] for i in first], [forced[i] for i in first]
    )
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
            soundfile.write(path, wav, pipeline.codec.sample_rate)
            result.rows.append(
                RowResult(
                    id=u.id,
                    batch=number,
                    tokens=len(ids),
                    semantic_tokens=len(pipeline.prompter.ids.semantic_ids(ids)),
                    forced_tokens=forced[i],
                    audio_s=len(wav) / pipeline.codec.sample_rate,
                    wav=str(path),
                )
            )
    return result


def torch_backend(
    settings: OfflineSettings,
    prompter: SparkPrompter,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
) -> Generate:
    from tritontts.llm.engine import LLMEngine
    from tritontts.llm.sequence import SamplingParams

    engine = LLMEngine.from_pretrained(
        settings.llm_dir,
        device=device,
        dtype=dtype,
        max_batch_size=max(settings.batch_sizes),
        max_seq_len=max_seq_len,
        cuda_graphs=device.type == "cuda",
        compile=settings.compile,
    )
    counter = iter(range(1 << 62))

    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        params = [
            SamplingParams(
                max_tokens=n or settings.max_new_tokens,
                min_tokens=n or 0,
                temperature=TEMPERATURE,
                top_k=TOP_K,
                top_p=TOP_P,
                seed=settings.seed * 1_000_003 + next(counter),
                end_id=prompter.end_id,
                pad_id=prompter.pad_id,
            )
            for n in forced
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
    settings: OfflineSettings, prompter: SparkPrompter, device: torch.device, dtype: torch.dtype
) -> Generate:
    """Rows of a batch with fewer forced tokens than the batch's longest are generated as far as the longest
    (as `generate` does for every static batch) and cut to their own count."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(settings.llm_dir), dtype=dtype).to(device).eval()
    if settings.compile:
        model.forward = torch.compile(model.forward)
    end_id, pad_id = prompter.end_id, prompter.pad_id

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
            temperature=TEMPERATURE,
            top_k=TOP_K,
            top_p=TOP_P,
            max_new_tokens=longest or settings.max_new_tokens,
            eos_token_id=end_id,
            pad_token_id=pad_id,
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


def trtllm_backend(settings: OfflineSettings, prompter: SparkPrompter) -> Generate:
    """Like `hf`, a batch runs as far as its longest forced count; rows are cut to their own."""
    if not trtllm_available():
        raise BackendUnavailable(TRTLLM_MISSING)
    if settings.engine_dir is None:
        raise ValueError("the trtllm backend needs --engine-dir (the output of trtllm-build)")
    from tensorrt_llm.runtime import ModelRunnerCpp

    runner = ModelRunnerCpp.from_dir(
        engine_dir=str(settings.engine_dir), max_batch_size=max(settings.batch_sizes)
    )
    end_id, pad_id = prompter.end_id, prompter.pad_id

    @torch.inference_mode()
    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        longest = max((n for n in forced if n is not None), default=None)
        out = runner.generate(
            batch_input_ids=[torch.from_numpy(np.asarray(p, dtype=np.int32)) for p in prompts],
            max_new_tokens=longest or settings.max_new_tokens,
            min_length=longest or 1,
            end_id=end_id,
            pad_id=pad_id,
            temperature=TEMPERATURE,
            top_k=TOP_K,
            top_p=TOP_P,
            random_seed=settings.seed,
            return_dict=True,
            output_sequence_lengths=True,
        )
        ids, lengths = out["output_ids"], out["sequence_lengths"]
        rows = [ids[i, 0, len(p) : int(lengths[i, 0])].tolist() for i, p in enumerate(prompts)]
        return [_until_end(row, end_id, n) for row, n in zip(rows, forced, strict=True)]

    return generate


def environment(
    settings: OfflineSettings, device: torch.device, dtype: torch.dtype, max_seq_len: int
) -> dict:
    return {
        "backend": settings.backend,
        "device": str(device),
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "codec_dtype": "float32",
        "settings": {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()},
            "max_seq_len": max_seq_len,
            "sampling": {"temperature": TEMPERATURE, "top_k": TOP_K, "top_p": TOP_P},
            "token_rate": TOKEN_RATE,
        },
        "timing": (
            "wall_s: a batch from its audio tokenizer call to its last vocoded sample (prompt building "
            "included, WAV writing excluded), torch.cuda.synchronize() around every stage on CUDA; rtf = "
            "wall_s / audio_s; llm_tokens_per_s = tokens / llm_s. With --realistic-lengths, the hf and trtllm "
            "backends run every row of a batch to the batch's largest forced count (static batching) and cut "
            "each row to its own; tokens counts only the rows' own tokens"
        ),
        "warmup_note": WARMUP_NOTE,
    }


def run_offline(settings: OfflineSettings, rows: Sequence[Utterance], log_dir: Path) -> dict:
    """Every batch size over `rows`; writes WAVs under `log_dir/<backend>_bs<N>/`, returns the report dict."""
    if settings.backend not in BACKENDS:
        raise ValueError(f"unknown backend {settings.backend!r}; choose from {BACKENDS}")
    if settings.backend == "trtllm" and not trtllm_available():
        raise BackendUnavailable(TRTLLM_MISSING)
    if not rows:
        raise ValueError("no rows to synthesize")
    device = resolve_device(settings.device)
    dtype = resolve_dtype(settings.dtype, device, settings.llm_dir)
    prompter = SparkPrompter(settings.llm_dir)
    forced = forced_token_counts(rows, settings.realistic_lengths)
    most = max((n for n in forced if n is not None), default=settings.max_new_tokens)
    max_seq_len = settings.max_seq_len or plan_max_seq_len(rows, prompter, most)
    codec = SparkCodec(settings.model_dir, device)
    if settings.backend == "torch":
        generate = torch_backend(settings, prompter, device, dtype, max_seq_len)
    elif settings.backend == "hf":
        generate = hf_backend(settings, prompter, device, dtype)
    else:
        generate = trtllm_backend(settings, prompter)
    pipeline = Pipeline(codec, prompter, generate)
    results = [
        run_batch_size(pipeline, rows, bs, forced, Path(log_dir) / f"{settings.backend}_bs{bs}")
        for bs in settings.batch_sizes
    ]
    return {**environment(settings, device, dtype, max_seq_len), "results": [r.summary() for r in results]}


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown_table(report: dict) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in report["results"]:
        cells = (
            report["backend"],
            str(r["batch_size"]),
            str(r["rows"]),
            _num(r["audio_s"], 2),
            _num(r["wall_s"]),
            _num(r["rtf"], 4),
            _num(r["tokenizer_s"]),
            _num(r["llm_s"]),
            _num(r["vocoder_s"]),
            _num(r["llm_tokens_per_s"], 1),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, log_dir: Path) -> dict[str, Path]:
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": log_dir / f"offline_{report['backend']}.json",
        "markdown": log_dir / f"offline_{report['backend']}.md",
    }
    paths["json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    paths["markdown"].write_text(markdown_table(report))
    return paths
