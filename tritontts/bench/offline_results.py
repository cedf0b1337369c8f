"""What a one-process benchmark run measures: the seconds of each stage, one record per row, and one result per
batch size, named in the report after the model's own stages."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
