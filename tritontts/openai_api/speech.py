"""The `POST /v1/audio/speech` body and its checks, in OpenAI's field names."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tritontts.openai_api.encode import FORMATS, UNSUPPORTED, missing_formats
from tritontts.openai_api.errors import ApiError, bad_request
from tritontts.openai_api.settings import ModelRoute, Settings

STREAM_FORMATS = ("audio", "sse")


class VoiceRef(BaseModel):
    id: str


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: str | VoiceRef
    response_format: str = "mp3"
    speed: float = 1.0
    stream_format: str | None = None
    instructions: str | None = None

    @property
    def voice_name(self) -> str:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


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
    if request.speed != 1.0:
        raise bad_request(
            f"speed {request.speed} is not supported: this server speaks at the model's own pace (speed 1.0 only)",
            "speed",
            "unsupported_value",
        )
    if request.stream_format is not None and request.stream_format not in STREAM_FORMATS:
        raise bad_request(
            f"stream_format must be 'audio' or 'sse', not '{request.stream_format}'", "stream_format"
        )
    if request.instructions and request.instructions.strip():
        raise bad_request(
            "instructions are not supported by this server's models", "instructions", "unsupported_value"
        )
    return route
