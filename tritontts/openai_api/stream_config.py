"""A speech stream's `session.config`: every field of `POST /v1/audio/speech` but `input` and `stream_format`, plus
`stream_audio` and `split_granularity`, checked as the REST request is (tritontts.openai_api.speech) and turned
into the Triton inputs of its voice once, for every sentence the session will speak."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from tritontts.openai_api.errors import ApiError, bad_request
from tritontts.openai_api.long_form import SpeechText
from tritontts.openai_api.settings import ModelRoute, Settings
from tritontts.openai_api.speech import SpeechRequest, check_speech_request
from tritontts.openai_api.triton_client import Deployment, TritonTTS
from tritontts.openai_api.voice_request import TritonVoice, VoiceChoice, choose_voice, triton_voice
from tritontts.openai_api.voices import VoiceStore
from tritontts.text import TextNormalizer

SESSION_ONLY = ("type", "api_key", "stream_audio", "split_granularity", "bistream")
PLACEHOLDER_INPUT = "-"
"""the `input` the REST checks need; the session's text comes in `input.text` messages"""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    stream_audio: StrictBool = False
    split_granularity: Literal["none", "sentence", "clause"] = "none"
    bistream: StrictBool = False
    """our extension: each utterance is one request whose text is pushed as it comes (stream_bistream)"""


@dataclass(frozen=True)
class StreamSetup:
    """What a configured session speaks with: one model, one voice, one format."""

    route: ModelRoute
    deployment: Deployment
    choice: VoiceChoice
    voice: TritonVoice
    response_format: str
    stream_audio: bool
    granularity: str
    normalize: bool
    bistream: bool = False

    @property
    def sample_rate(self) -> int:
        return self.route.sample_rate

    def text(self, value: str, normalizer: TextNormalizer) -> SpeechText:
        """`value` as the segments one request each may take (normalized when the session normalizes)."""
        return SpeechText(value, normalizer, self.normalize, self.deployment.max_text_length)


def _invalid(err: ValidationError) -> ApiError:
    first = err.errors()[0]
    location = [str(part) for part in first.get("loc", ())]
    param = location[0] if location else None
    if first.get("type") == "missing":
        return bad_request(f"session.config: '{param}' is required", param, "missing_required_parameter")
    return bad_request(f"session.config: '{'.'.join(location)}': {first.get('msg', 'is invalid')}", param)


async def configure(
    message: dict,
    settings: Settings,
    triton: TritonTTS,
    voices: VoiceStore,
    normalizer: TextNormalizer,
) -> StreamSetup:
    """The session's setup from its `session.config` message; an ApiError naming the field otherwise. `model` may
    be left out: the first model served. `response_format` defaults to `pcm` with `stream_audio`, else `wav`."""
    fields = {k: v for k, v in message.items() if k not in SESSION_ONLY}
    if "input" in fields or "stream_format" in fields:
        name = "input" if "input" in fields else "stream_format"
        raise bad_request(f"session.config takes no '{name}': send the text in input.text messages", name)
    try:
        options = StreamOptions.model_validate(message)
        fields.setdefault("model", settings.routes[0].name if settings.routes else "")
        fields.setdefault("response_format", "pcm" if options.stream_audio else "wav")
        body = SpeechRequest.model_validate(fields | {"input": PLACEHOLDER_INPUT})
    except ValidationError as err:
        raise _invalid(err) from None
    if options.stream_audio and body.response_format != "pcm":
        raise bad_request(
            "stream_audio sends 16-bit PCM chunks: response_format must be 'pcm' (or left out)",
            "response_format",
        )
    route = check_speech_request(body, settings)
    deployment = await triton.deployment(route)
    if options.stream_audio and deployment.streaming_model is None:
        raise bad_request(
            f"model '{route.name}' has no streaming (decoupled) model on Triton: set stream_audio false",
            "stream_audio",
            "streaming_unavailable",
        )
    if options.bistream and deployment.text_inbox is None:
        raise bad_request(
            f"model '{route.name}' takes no bistream sessions (its streaming Triton model names no "
            "text_inbox_model: CosyVoice2, CosyVoice2 + DiT and CosyVoice3 do); leave bistream out",
            "bistream",
            "bistream_unavailable",
        )
    choice = choose_voice(body, deployment)
    raw = await run_in_threadpool(triton_voice, choice, deployment, voices, PLACEHOLDER_INPUT)
    normalize = body.text_normalization
    voice = await SpeechText("", normalizer, normalize, deployment.max_text_length).voice(raw)
    return StreamSetup(
        route,
        deployment,
        choice,
        voice,
        body.response_format,
        options.stream_audio,
        options.split_granularity,
        normalize,
        options.bistream,
    )


async def without_profile(setup: StreamSetup, voices: VoiceStore, normalizer: TextNormalizer) -> StreamSetup:
    """`setup` sending the saved voice's audio instead of its profile (a profile of another checkpoint)."""
    raw = await run_in_threadpool(
        triton_voice, setup.choice, setup.deployment, voices, PLACEHOLDER_INPUT, False
    )
    return replace(setup, voice=await setup.text("", normalizer).voice(raw))
