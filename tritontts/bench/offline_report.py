"""The one-process benchmark's report: what ran where and how it was timed, a Markdown table of the results,
and the files both are written to."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from tritontts.bench.offline_pipeline import OfflinePipeline
from tritontts.bench.offline_settings import OfflineSettings
from tritontts.bench.offline_timing import device_name

WARMUP_NOTE = (
    "before the measured pass of each batch size, its first batch is run once as a warm-up (CUDA graph "
    "capture, compilation, first-call costs); the warm-up is timed separately under `warmup` and excluded "
    "from every total; the measured pass then runs all rows, the first batch included"
)


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
