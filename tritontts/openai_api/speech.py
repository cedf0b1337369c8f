"""The `POST /v1/audio/speech` body and its checks, in OpenAI's field names, plus vLLM-Omni's `ref_audio`,
`ref_text` and `task_type`, and a voice object for Spark-TTS voice creation.

Which voice fields a model honours depends on its BLS (`voice_modes`); tritontts.openai_api.voice_request checks
those against the deployment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tritontts.openai_api.encode import FORMATS, UNSUPPORTED, missing_formats
from tritontts.openai_api.errors import ApiError, bad_request
from tritontts.openai_api.settings import ModelRoute, Settings
from tritontts.text.normalize import unavailable_reason

STREAM_FORMATS = ("audio", "sse")
TASK_TYPES = ("Base", "VoiceDesign", "CustomVoice")
MIN_SPEED, MAX_SPEED = 0.25, 4.0
SPEED_LEVELS = (
    (0.625, "very_low"),
    (0.875, "low"),
    (1.125, "moderate"),
    (1.375, "high"),
    (MAX_SPEED, "very_high"),
)
"""Spark-TTS's speed levels for OpenAI's `speed`: each level takes the speeds below its bound (and from the previous
bound): 0.25-0.625 very_low, 0.625-0.875 low, 0.875-1.125 moderate, 1.125-1.375 high, 1.375-4.0 very_high."""


def speed_level(speed: float) -> str:
    return next(level for bound, level in SPEED_LEVELS if speed < bound or bound == MAX_SPEED)


class VoiceRef(BaseModel):
    id: str


class VoiceDesign(BaseModel):
    """Spark-TTS voice creation: `{"gender": "female"|"male", "pitch": LEVEL, "speed": LEVEL}`."""

    model_config = ConfigDict(extra="forbid")

    gender: str
    pitch: str | None = None
    speed: str | None = None


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str
    input: str
    voice: str | VoiceRef | VoiceDesign | None = None
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str | None = None
    instructions: str | None = None
    ref_audio: str | bytes | None = None
    """base64 audio (or a `data:audio/...;base64,` URI) in JSON; the file part's bytes in multipart"""
    ref_text: str | None = None
    task_type: str | None = None
    text_normalization: bool | None = None
    """upstream CosyVoice's text front end on `input` and the voice's transcript (tritontts.text); false sends
    them as written (a long input is still cut into segments); left out: the server's `--no-text-normalization`
    decides (on unless given)"""

    @property
    def voice_name(self) -> str | None:
        if isinstance(self.voice, VoiceRef):
            return self.voice.id
        return self.voice if isinstance(self.voice, str) else None

    @property
    def design(self) -> VoiceDesign | None:
        return self.voice if isinstance(self.voice, VoiceDesign) else None


def check_speech_request(request: SpeechRequest, settings: Settings) -> ModelRoute:
    """The route of the request's model, after every field is checked; an ApiError naming the field otherwise."""
    route = settings.route(request.model)
    if route is None:
        known = ", ".join(r.name for r in settings.routes)
        raise ApiError(
            404, f"model '{request.model}' not found (served: {known})", "model", "model_not_found"
        )
    if not request.input.strip():
        raise bad_request("input is empty", "input", "empty_input")
    if len(request.input) > settings.max_input_chars:
        raise bad_request(
            f"input has {len(request.input)} characters; at most {settings.max_input_chars} are accepted",
            "input",
            "string_above_max_length",
        )
    if request.response_format in UNSUPPORTED:
        raise bad_request(
            f"response_format '{request.response_format}' is not supported: {UNSUPPORTED[request.response_format]}",
            "response_format",
            "unsupported_value",
        )
    if request.response_format not in FORMATS:
        raise bad_request(
            f"response_format must be one of {', '.join(FORMATS)}, not '{request.response_format}'",
            "response_format",
        )
    if request.response_format in missing_formats():
        raise bad_request(
            f"response_format '{request.response_format}' needs a libsndfile that writes it (1.1+ for mp3, "
            "1.0.29+ for opus, as bundled in the soundfile wheels); this server's cannot",
            "response_format",
            "unsupported_value",
        )
    if not MIN_SPEED <= request.speed <= MAX_SPEED:
        raise bad_request(f"speed must be in {MIN_SPEED}..{MAX_SPEED}, got {request.speed}", "speed")
    if request.stream_format is not None and request.stream_format not in STREAM_FORMATS:
        raise bad_request(
            f"stream_format must be 'audio' or 'sse', not '{request.stream_format}'", "stream_format"
        )
    if request.task_type is not None and request.task_type not in TASK_TYPES:
        raise bad_request(
            f"task_type must be one of {', '.join(TASK_TYPES)}, not '{request.task_type}'", "task_type"
        )
    if request.text_normalization is None:
        request.text_normalization = settings.text_normalization
    if request.text_normalization and (reason := unavailable_reason()) is not None:
        raise bad_request(
            f"this server cannot normalize text ({reason}; it needs wetext and inflect): "
            "send text_normalization false",
            "text_normalization",
            "unsupported_value",
        )
    return route
