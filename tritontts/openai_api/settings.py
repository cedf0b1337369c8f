"""What the API serves and how: the model map, the voices folder, limits and the optional key."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from tritontts.bench.triton_io import output_sample_rate


@dataclass(frozen=True)
class ModelRoute:
    """An API model name and the Triton models behind it.

    Which of `triton_models` streams is read from each one's config (decoupled or not) at request time, so one
    route may list a decoupled model, a non-decoupled one, or both.
    """

    name: str
    triton_models: tuple[str, ...]
    sample_rate: int


@dataclass(frozen=True)
class Settings:
    triton_url: str = "localhost:8001"
    routes: tuple[ModelRoute, ...] = ()
    voices_dir: Path = Path("voices")
    api_key: str | None = None
    max_input_chars: int = 20000
    """the longest `input` accepted; it is synthesized segment after segment (tritontts.text)"""
    max_request_bytes: int = 1 << 20
    max_upload_bytes: int = 20 << 20
    ws_config_timeout_s: float = 10.0  # WS /v1/audio/speech/stream: seconds to a valid session.config
    ws_idle_timeout_s: float = 30.0  # ... with no message and nothing to speak, the session closes
    ws_max_message_bytes: int = 128 << 10  # ... the longest message after session.config
    max_reference_seconds: float = 30.0
    request_timeout_s: float = 600.0
    max_new_tokens: int | None = None  # sent as Triton's max_new_tokens request parameter when set
    model_config_ttl_s: float = 5.0
    max_concurrent_requests: int = 0  # speech requests at once; past it 429 (0: no limit of ours)
    queue_timeout_s: float = (
        0.0  # sent as Triton's request `timeout`: longer in its queue is rejected (0: none)
    )
    retry_after_s: int = 2  # the Retry-After of 429 and 503 answers to overload
    text_normalization: bool = True
    """normalize `input` when a request leaves `text_normalization` out (the API loads wetext at startup)"""
    ui: bool = True  # the page for trying voices at /ui/ (tritontts.openai_api.ui)

    def route(self, name: str) -> ModelRoute | None:
        return next((r for r in self.routes if r.name == name), None)


DEFAULT_MODEL_SPEC = "spark-tts=spark_tts,spark_tts_offline"


def parse_model_spec(spec: str) -> ModelRoute:
    """`NAME=TRITON_MODEL[,TRITON_MODEL...][,sample_rate=HZ]`, e.g. `spark-tts=spark_tts,spark_tts_offline`."""
    name, sep, rest = spec.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"model spec '{spec}' is not NAME=TRITON_MODEL[,TRITON_MODEL][,sample_rate=HZ]")
    models, rate = [], None
    for item in (i.strip() for i in rest.split(",") if i.strip()):
        key, is_option, value = item.partition("=")
        if not is_option:
            models.append(item)
        elif key == "sample_rate":
            rate = int(value)
        else:
            raise ValueError(f"model spec '{spec}': unknown option '{key}' (only sample_rate=HZ)")
    return _route(name.strip(), models, rate)


def load_model_map(path: str | Path) -> tuple[ModelRoute, ...]:
    """A JSON or YAML file: `{api_name: {"triton_models": [...], "sample_rate": HZ}}` (sample_rate optional)."""
    text = Path(path).read_text()
    data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a mapping of API model names to Triton models")
    routes = []
    for name, entry in data.items():
        entry = {"triton_models": entry} if isinstance(entry, (list, str)) else entry
        models = entry.get("triton_models")
        routes.append(
            _route(
                str(name),
                [models] if isinstance(models, str) else list(models or []),
                entry.get("sample_rate"),
            )
        )
    return tuple(routes)


def _route(name: str, models: list[str], rate: int | None) -> ModelRoute:
    if not models:
        raise ValueError(f"model '{name}' names no Triton model")
    if rate is None:
        try:
            rate = output_sample_rate(models[0])
        except ValueError as err:
            raise ValueError(f"model '{name}': {err} (add sample_rate=HZ)") from None
    if rate <= 0:
        raise ValueError(f"model '{name}': sample_rate must be positive")
    return ModelRoute(name, tuple(models), int(rate))
