"""`WS /v1/audio/speech/stream`: text in as it is written, audio out sentence by sentence (vLLM-Omni's protocol).

Client messages, JSON text frames: `session.config` (the REST fields, `stream_audio`, `split_granularity`), then
`input.text` deltas, `input.done` (speak what is buffered; the session goes on), `session.close`. Server messages:
`session.created`; per segment `audio.start`, binary audio and `audio.done` (stream_speaker); `session.done` once
what an `input.done` or `session.close` flushed has been spoken (`closed: true` for the close, after which the
socket closes); `error` naming the field or problem, after which a bad message's session closes (1008).

Two tasks share a session: the receiver cuts the text into sentences (stream_text) and queues each the moment it is
complete; the synthesizer speaks the queue in order, one Triton request in flight, with the voice set up once from
the config (stream_config). Docs: docs/streaming-text.md.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket

from tritontts.json_body import JsonBodyError, parse_json_object
from tritontts.openai_api.errors import ApiError
from tritontts.openai_api.settings import Settings
from tritontts.openai_api.stream_auth import key_matches, offered_key, refusal
from tritontts.openai_api.stream_bistream import BistreamUtterance
from tritontts.openai_api.stream_channel import (
    NORMAL,
    POLICY,
    SERVER_FAILURE,
    Channel,
    gone,
    problem,
    quietly,
)
from tritontts.openai_api.stream_config import StreamSetup, configure
from tritontts.openai_api.stream_speaker import Speaker
from tritontts.openai_api.stream_text import SentenceBuffer
from tritontts.openai_api.triton_client import TritonTTS
from tritontts.openai_api.voices import VoiceStore
from tritontts.text import TextNormalizer

log = logging.getLogger("tritontts.openai_api.stream")
STREAM_PATH = "/v1/audio/speech/stream"
MESSAGE_TYPES = ("session.config", "input.text", "input.done", "session.close")


@dataclass(frozen=True)
class Job:
    """A sentence to speak (`text`), or the end of an utterance (`text` None; `closes` for session.close)."""

    utterance: int
    text: str | None = None
    closes: bool = False
    bistream: BistreamUtterance | None = None
    """a bistream session's utterance, spoken as its text comes"""


class SpeechStream:
    def __init__(
        self,
        websocket: WebSocket,
        settings: Settings,
        triton: TritonTTS,
        voices: VoiceStore,
        normalizer: TextNormalizer,
    ) -> None:
        self.websocket, self.settings, self.triton = websocket, settings, triton
        self.voices, self.normalizer = voices, normalizer
        self.channel = Channel(websocket)
        self.setup: StreamSetup | None = None
        self.speaker: Speaker | None = None
        self.buffer = SentenceBuffer()
        self.jobs: asyncio.Queue[Job] = asyncio.Queue()
        self.queued_chars = 0
        self.busy = False
        self.closing = False
        self.utterance = 0
        self.current: BistreamUtterance | None = None
        self.authorized = not settings.api_key

    async def run(self) -> None:
        await self.websocket.accept()
        if not await self._handshake_key():
            return
        tasks = [asyncio.create_task(self._synthesize()), asyncio.create_task(self._receive())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        failure = next((r for r in results if isinstance(r, Exception) and not gone(r)), None)
        if failure is not None:
            log.error("speech stream failed", exc_info=failure)
            await quietly(self.channel.error(ApiError(500, "internal error", code="server_error")))
            await self.channel.close(SERVER_FAILURE, "internal error")
        await self.channel.close(NORMAL)

    # --- the receiving side -------------------------------------------------------------------------------

    async def _refuse(self) -> None:
        await quietly(self.channel.error(refusal()))
        await self.channel.close(POLICY, "invalid_api_key")

    async def _handshake_key(self) -> bool:
        offered = offered_key(self.websocket)
        if self.authorized or offered is None:
            return True  # without one on the upgrade request, the key must come in session.config
        if not key_matches(self.settings.api_key, offered):
            await self._refuse()
            return False
        self.authorized = True
        return True

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.ws_config_timeout_s
        while True:
            waiting = self.setup is None
            timeout = deadline - loop.time() if waiting else self.settings.ws_idle_timeout_s
            try:
                message = await asyncio.wait_for(self.websocket.receive(), max(timeout, 0.0))
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                if waiting:
                    seconds = self.settings.ws_config_timeout_s
                    await self.channel.error(
                        problem(f"no valid session.config within {seconds:g} s", "config_timeout")
                    )
                    await self.channel.close(POLICY, "config_timeout")
                    return
                if self.busy or not self.jobs.empty():
                    continue
                seconds = self.settings.ws_idle_timeout_s
                await self.channel.error(
                    problem(f"no message for {seconds:g} s: session closed", "idle_timeout")
                )
                await self.channel.close(NORMAL, "idle_timeout")
                return
            if message["type"] == "websocket.disconnect":
                return
            try:
                await self._handle(message)
            except ApiError as err:  # a bad message ends the session: the client sees why, then the close
                await self.channel.error(err)
                await self.channel.close(POLICY, err.code or "bad_message")
            if self.channel.closed:
                return

    def _parse(self, message: dict) -> dict:
        raw = message.get("text")
        if raw is None:
            raise problem("send JSON text frames; binary frames are not taken", "invalid_message")
        limit = self.settings.max_request_bytes if self.setup is None else self.settings.ws_max_message_bytes
        if len(raw) > limit or len(raw.encode("utf-8", "surrogatepass")) > limit:
            raise problem(f"the message is larger than {limit} bytes", "message_too_large")
        try:
            data = parse_json_object(raw)
        except JsonBodyError as err:
            raise problem(err.message.replace("the request body", "the message", 1), "invalid_json") from None
        if not isinstance(data.get("type"), str):
            raise problem("a message needs a 'type' (a string)", "missing_required_parameter", "type")
        return data

    async def _handle(self, message: dict) -> None:
        data = self._parse(message)
        kind = data["type"]
        if kind not in MESSAGE_TYPES:
            raise problem(f"unknown message type '{kind[:64]}'", "unknown_type", "type")
        if self.closing:
            raise problem(f"{kind} after session.close: the session is closing", "session_closing", "type")
        if kind == "session.config":
            await self._configure(data)
        elif self.setup is None and kind == "session.close":
            await self.channel.json(
                {"type": "session.done", "utterance_index": 0, "total_sentences": 0, "closed": True}
            )
            await self.channel.close(NORMAL)
        elif self.setup is None:
            raise problem(f"send session.config before {kind}", "missing_config", "type")
        elif kind == "input.text":
            self._add_text(data.get("text"))
        else:
            self._flush(closes=kind == "session.close")

    async def _configure(self, data: dict) -> None:
        if self.setup is not None:
            raise problem(
                "the session is configured already (one session.config per connection)",
                "config_already_set",
                "type",
            )
        if not self.authorized:
            if not key_matches(self.settings.api_key, data.get("api_key")):
                await self._refuse()
                return
            self.authorized = True
        setup = await configure(data, self.settings, self.triton, self.voices, self.normalizer)
        self.buffer = SentenceBuffer(setup.granularity, setup.deployment.max_text_length)
        self.setup = setup
        self.speaker = Speaker(self.channel, self.triton, self.voices, self.normalizer, setup)
        await self.channel.json(
            {
                "type": "session.created",
                "model": setup.route.name,
                "format": setup.response_format,
                "sample_rate": setup.sample_rate,
                "stream_audio": setup.stream_audio,
                "split_granularity": setup.granularity,
            }
            | ({"bistream": True} if setup.bistream else {})
        )

    def _queue(self, job: Job) -> None:
        self.queued_chars += len(job.text or "")
        self.jobs.put_nowait(job)

    def _add_text(self, text: object) -> None:
        if not isinstance(text, str):
            raise problem("input.text needs 'text', a string", "invalid_value", "text")
        limit = self.settings.max_input_chars
        if self.setup.bistream:
            self._add_bistream_text(text, limit)
            return
        if len(self.buffer.text) + self.queued_chars + len(text) > limit:
            raise problem(
                f"more than {limit} characters would wait to be spoken; this text is dropped",
                "string_above_max_length",
                "text",
            )
        for sentence in self.buffer.push(text):
            self._queue(Job(self.utterance, sentence))

    def _add_bistream_text(self, text: str, limit: int) -> None:
        if self.current is None:
            self.current = BistreamUtterance(self.triton, self.setup, self.settings.ws_idle_timeout_s)
            self._queue(Job(self.utterance, bistream=self.current))
        if len(self.current.text) + len(text) > limit:
            raise problem(f"an utterance takes at most {limit} characters", "string_above_max_length", "text")
        self.current.add(text)

    def _flush(self, closes: bool) -> None:
        if self.current is not None:
            self.current.finish()
            self.current = None
        rest = self.buffer.flush()
        if rest:
            self._queue(Job(self.utterance, rest))
        self._queue(Job(self.utterance, closes=closes))
        self.utterance += 1
        self.closing = closes

    # --- the synthesizing side ----------------------------------------------------------------------------

    async def _synthesize(self) -> None:
        spoken = 0
        while True:
            job = await self.jobs.get()
            self.busy = True
            try:
                if job.bistream is not None:
                    await job.bistream.speak(self.channel, job.utterance)
                    spoken += 1
                    continue
                if job.text is None:
                    done = {
                        "type": "session.done",
                        "utterance_index": job.utterance,
                        "total_sentences": spoken,
                    }
                    await self.channel.json(done | ({"closed": True} if job.closes else {}))
                    spoken = 0
                    if job.closes:
                        await self.channel.close(NORMAL)
                        return
                    continue
                self.queued_chars -= len(job.text)
                text = self.setup.text(job.text, self.normalizer)
                while (segment := await text.next()) is not None:
                    await self.speaker.speak(job.utterance, spoken, segment)
                    spoken += 1
            finally:
                self.busy = False


def speech_stream_router(
    settings: Settings, triton: TritonTTS, voices: VoiceStore, normalizer: TextNormalizer
) -> APIRouter:
    router = APIRouter()

    @router.websocket(STREAM_PATH)
    async def speech_stream(websocket: WebSocket) -> None:
        await SpeechStream(websocket, settings, triton, voices, normalizer).run()

    return router
