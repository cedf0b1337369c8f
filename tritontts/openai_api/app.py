"""The FastAPI app: speech (whole, chunked audio, SSE; JSON or multipart), voices (list, upload with profiles,
delete), models, health; OpenAI-style errors."""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from fastapi import Depends, FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.datastructures import UploadFile

from tritontts.audio import AudioLimits
from tritontts.json_body import parse_json_object
from tritontts.openai_api.encode import FORMATS, StreamEncoder, encode
from tritontts.openai_api.errors import ApiError, bad_request, install_error_handlers, validated
from tritontts.openai_api.limits import BodySizeLimit, ConcurrencyLimit
from tritontts.openai_api.long_form import SpeechText, inputs, segment_samples
from tritontts.openai_api.settings import ModelRoute, Settings
from tritontts.openai_api.speech import SpeechRequest, check_speech_request
from tritontts.openai_api.stream_ws import speech_stream_router
from tritontts.openai_api.triton_client import TritonTTS
from tritontts.openai_api.voice_request import TritonVoice, choose_voice, profile_request, triton_voice
from tritontts.openai_api.voices import Voice, VoiceStore
from tritontts.text import TextNormalizer
from tritontts.text.normalize import check_available
from tritontts.voice_profile import ProfileError

log = logging.getLogger("tritontts.openai_api")
VOICES_PATH = "/v1/audio/voices"
SPEECH_PATH = "/v1/audio/speech"
STALE_PROFILE = "voice_checkpoint:"
"""How a BLS refuses a profile made with another checkpoint: the profile is made again and the request retried."""


def create_app(settings: Settings, triton: TritonTTS | None = None) -> FastAPI:
    triton = triton or TritonTTS(
        settings.triton_url,
        settings.request_timeout_s,
        settings.model_config_ttl_s,
        settings.max_new_tokens,
        settings.queue_timeout_s,
        settings.retry_after_s,
    )
    voices = VoiceStore(
        settings.voices_dir, AudioLimits(max_seconds=settings.max_reference_seconds), settings.max_input_chars
    )
    normalizer = TextNormalizer()

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        if settings.text_normalization:
            check_available()  # a missing wetext stops the start here, not every request with a 500
            threading.Thread(target=normalizer.load, name="load-text-normalizer", daemon=True).start()
        yield
        await triton.close()

    app = FastAPI(title="tritontts OpenAI-compatible speech API", lifespan=lifespan)
    app.add_middleware(
        BodySizeLimit,
        max_request_bytes=settings.max_request_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        upload_paths=(VOICES_PATH,),
        form_upload_paths=(SPEECH_PATH,),  # a multipart speech request may carry a reference audio file
    )
    app.add_middleware(
        ConcurrencyLimit,
        max_inflight=settings.max_concurrent_requests,
        paths=(SPEECH_PATH,),
        retry_after_s=settings.retry_after_s,
    )
    install_error_handlers(app)
    app.state.settings, app.state.triton, app.state.voices = settings, triton, voices

    def authorized(request: Request) -> None:
        if not settings.api_key:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), settings.api_key.encode()
        ):
            raise ApiError(
                401,
                "Incorrect or missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    auth = [Depends(authorized)]
    app.include_router(speech_stream_router(settings, triton, voices, normalizer))  # docs/streaming-text.md

    @app.get("/health")
    async def health() -> JSONResponse:
        live, ready = await asyncio.gather(triton.server_live(), triton.server_ready())
        models = {}
        for route in settings.routes:
            try:
                deployed = await triton.deployment(route) if live else None
            except ApiError:
                deployed = None
            models[route.name] = {
                "ready": deployed is not None,
                "streaming_model": deployed and deployed.streaming_model,
                "offline_model": deployed and deployed.offline_model,
                "sample_rate": route.sample_rate,
            }
        ok = live and all(m["ready"] for m in models.values())
        body = {
            "status": "ok" if ok else "unavailable",
            "triton": {"url": settings.triton_url, "live": live, "ready": ready},
            "models": models,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v1/models", dependencies=auth)
    async def list_models() -> dict:
        """Each model with its rate and, when its Triton models are ready, its voice modes (the BLS's
        `voice_modes`), whether it streams and whether it takes bistream sessions (its streaming BLS names a
        `text_inbox_model`, as stream_config checks); `ready: false` with `modes: null` otherwise."""

        async def card(route: ModelRoute) -> dict:
            try:
                deployed = await triton.deployment(route)
            except ApiError:
                deployed = None
            return {
                "id": route.name,
                "object": "model",
                "owned_by": "tritontts",
                "sample_rate": route.sample_rate,
                "ready": deployed is not None,
                "modes": sorted(deployed.modes) if deployed else None,
                "streaming": deployed.streaming_model is not None if deployed else None,
                "bistream": deployed.text_inbox is not None if deployed else None,
            }

        return {"object": "list", "data": list(await asyncio.gather(*map(card, settings.routes)))}

    def describe(voice: Voice) -> dict:
        return voice.description(voices.profile_kinds(voice.name))

    @app.get(VOICES_PATH, dependencies=auth)
    async def list_voices() -> dict:
        return {"object": "list", "data": [describe(v) for v in await run_in_threadpool(voices.all)]}

    async def make_profiles(voice: Voice) -> None:
        """The voice's profile for each model family the routes serve now (one `voice_profile` request each);
        a family whose models are down gets none, and its requests send the audio as before."""
        done: set[str] = set()
        for route in settings.routes:
            try:
                deployment = await triton.deployment(route)
                if deployment.profile_kind is None or deployment.profile_kind in done:
                    continue
                profile = await triton.profile(deployment, profile_request(voice.samples))
            except (ApiError, ProfileError) as err:
                message = err.message if isinstance(err, ApiError) else str(err)
                log.warning("voice '%s': no profile for model '%s': %s", voice.name, route.name, message)
                continue
            await run_in_threadpool(voices.save_profile, voice.name, profile)
            done.add(profile.kind)

    @app.delete(VOICES_PATH + "/{name}", dependencies=auth)
    async def delete_voice(name: str) -> dict:
        await run_in_threadpool(voices.delete, name)
        log.info("voice '%s' deleted", name)
        return {"id": name, "object": "audio.voice.deleted", "deleted": True}

    @app.post(VOICES_PATH, dependencies=auth, status_code=201)
    async def add_voice(request: Request) -> dict:
        content_type = request.headers.get("content-type", "")
        if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
            raise bad_request(
                "send the voice as multipart/form-data (name, transcript, audio_sample)",
                code="invalid_content_type",
            )
        form = await request.form()
        audio = form.get("audio_sample") or form.get("audio")
        if not isinstance(audio, UploadFile):
            raise bad_request(
                "audio_sample (a WAV/FLAC/OGG/MP3 file part) is required",
                "audio_sample",
                "missing_required_parameter",
            )
        name, transcript = form.get("name"), form.get("transcript", form.get("text"))
        if not isinstance(name, str):
            raise bad_request("name is required", "name", "missing_required_parameter")
        if not isinstance(transcript, str):
            raise bad_request("transcript is required", "transcript", "missing_required_parameter")
        voice = await run_in_threadpool(voices.add, name, await audio.read(), transcript)
        await make_profiles(voice)
        description = describe(voice)
        log.info("voice '%s' added (%.2f s)", name, description["duration"])
        return description

    async def voice_inputs(body: SpeechRequest, deployment) -> TritonVoice:
        choice = choose_voice(body, deployment)
        return await run_in_threadpool(triton_voice, choice, deployment, voices, body.input)

    async def remade(body: SpeechRequest, deployment, sent: TritonVoice, error: ApiError) -> TritonVoice:
        """After a stale profile's refusal: the voice's profile made again, and the request's inputs with it."""
        if sent.profile is None or STALE_PROFILE not in error.message:
            raise error
        log.info("voice '%s': profile of another checkpoint, making it again", sent.saved.name)
        profile = await triton.profile(deployment, profile_request(sent.saved.samples))
        await run_in_threadpool(voices.save_profile, sent.saved.name, profile)
        return await voice_inputs(body, deployment)

    @app.post(SPEECH_PATH, dependencies=auth)
    async def speech(request: Request) -> Response:
        body = await _speech_body(request)
        route = check_speech_request(body, settings)
        deployment = await triton.deployment(route)
        text = SpeechText(body.input, normalizer, body.text_normalization, deployment.max_text_length)
        segment = await text.next()  # text_segments yields at least one
        sent = await text.voice(await voice_inputs(body, deployment))
        if body.stream_format is None:
            pieces = []
            while segment is not None:
                try:
                    pieces.append(await triton.synthesize(deployment, *inputs(sent, segment)))
                except ApiError as err:
                    if text.served > 1:
                        raise
                    sent = await text.voice(await remade(body, deployment, sent, err))
                    pieces.append(await triton.synthesize(deployment, *inputs(sent, segment)))
                segment = await text.next()
            audio = np.concatenate(pieces)
            content = await run_in_threadpool(encode, audio, route.sample_rate, body.response_format)
            return Response(content, media_type=FORMATS[body.response_format].media_type)
        chunks = triton.stream(deployment, *inputs(sent, segment))
        try:
            first = await anext(chunks)  # request errors arrive before any audio: they get their own status
        except StopAsyncIteration:
            first = np.zeros(0, dtype=np.float32)
        except ApiError as err:
            sent = await text.voice(await remade(body, deployment, sent, err))
            chunks = triton.stream(deployment, *inputs(sent, segment))
            first = await anext(chunks, np.zeros(0, dtype=np.float32))
        voice = sent
        samples = segment_samples(
            first,
            chunks,
            deployment.overlap_samples,
            text.next,
            lambda later: triton.stream(deployment, *inputs(voice, later)),
        )
        audio = _encoded_stream(samples, route.sample_rate, body.response_format)
        if body.stream_format == "sse":
            return StreamingResponse(
                _sse(audio, body.input, route.sample_rate), media_type="text/event-stream"
            )
        return StreamingResponse(_bytes(audio), media_type=FORMATS[body.response_format].media_type)

    if settings.ui:
        from tritontts.openai_api.ui import ui_router

        app.include_router(ui_router())
    return app


async def _speech_body(request: Request) -> SpeechRequest:
    """The body as JSON, or as multipart form fields (`ref_audio` may be a file part, `voice` a JSON object)."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        return validated(SpeechRequest, parse_json_object(await request.body()))
    form = await request.form()
    data: dict = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            data[key] = await value.read()
        elif key == "voice" and value.strip().startswith("{"):
            data[key] = parse_json_object(value, "voice")
        else:
            data[key] = value
    return validated(SpeechRequest, data)


async def _encoded_stream(
    samples: AsyncIterator[np.ndarray], sample_rate: int, format_name: str
) -> AsyncIterator[tuple[bytes, int]]:
    """(encoded bytes, samples) per piece of audio, then the encoder's end."""
    encoder = StreamEncoder(format_name, sample_rate)
    try:
        async for piece in samples:
            yield encoder.push(piece), piece.size
        yield encoder.finish(), 0
    finally:
        await samples.aclose()


async def _bytes(audio: AsyncIterator[tuple[bytes, int]]) -> AsyncIterator[bytes]:
    try:
        async for data, _ in audio:
            if data:
                yield data
    except ApiError as err:  # headers are gone: the stream ends early, the log says why
        log.warning("audio stream ended by an error: %s", err.message)
    finally:
        await audio.aclose()  # a client that goes away cancels the Triton request


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def _sse(audio: AsyncIterator[tuple[bytes, int]], text: str, sample_rate: int) -> AsyncIterator[bytes]:
    total = 0
    try:
        async for data, samples in audio:
            total += samples
            if data:
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    except ApiError as err:
        yield _event({"type": "error", **err.body()})
        return
    finally:
        await audio.aclose()
    usage = {"input_tokens": len(text), "output_tokens": 0, "total_tokens": len(text)}
    yield _event(
        {"type": "speech.audio.done", "usage": usage, "audio_seconds": round(total / sample_rate, 3)}
    )
