"""One segment of a speech stream spoken: `audio.start`, its audio as binary frames (16-bit PCM chunks as Triton's
decoupled model makes them, or one file in the session's format), `audio.done` with its length; a segment Triton
fails gets an `error` and `audio.done` with `error: true`, and the session goes on."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fastapi.concurrency import run_in_threadpool

from tritontts.openai_api.encode import encode, pcm16
from tritontts.openai_api.errors import ApiError
from tritontts.openai_api.long_form import inputs
from tritontts.openai_api.stream_channel import Channel
from tritontts.openai_api.stream_config import StreamSetup, without_profile
from tritontts.openai_api.triton_client import TritonTTS
from tritontts.openai_api.voices import VoiceStore
from tritontts.streaming import StreamCrossfader
from tritontts.text import TextNormalizer

log = logging.getLogger("tritontts.openai_api.stream")
STALE_PROFILE = "voice_checkpoint:"  # as app.STALE_PROFILE: the BLS refused a profile of another checkpoint


@dataclass
class Sent:
    bytes: int = 0
    samples: int = 0


class Speaker:
    def __init__(
        self,
        channel: Channel,
        triton: TritonTTS,
        voices: VoiceStore,
        normalizer: TextNormalizer,
        setup: StreamSetup,
    ) -> None:
        self.channel, self.triton, self.voices, self.normalizer = channel, triton, voices, normalizer
        self.setup = setup

    async def speak(self, utterance: int, index: int, segment: str) -> None:
        where = {"utterance_index": utterance, "sentence_index": index}
        rate = self.setup.sample_rate
        start = {
            "type": "audio.start",
            **where,
            "sentence_text": segment,
            "format": self.setup.response_format,
        }
        await self.channel.json(start | {"sample_rate": rate})
        sent, failed = Sent(), False
        try:
            try:
                await self._audio(segment, sent)
            except ApiError as err:
                if sent.bytes or self.setup.voice.profile is None or STALE_PROFILE not in err.message:
                    raise
                self.setup = await without_profile(self.setup, self.voices, self.normalizer)
                await self._audio(segment, sent)
        except ApiError as err:
            failed = True
            log.warning("speech stream: segment %d.%d failed: %s", utterance, index, err.message)
            await self.channel.error(err, **where)
        done = {"type": "audio.done", **where, "total_bytes": sent.bytes, "samples": sent.samples}
        await self.channel.json(done | {"duration": round(sent.samples / rate, 3), "error": failed})

    async def _audio(self, segment: str, sent: Sent) -> None:
        setup = self.setup
        arrays, parameters = inputs(setup.voice, segment)
        if not setup.stream_audio:
            samples = await self.triton.synthesize(setup.deployment, arrays, parameters)
            data = await run_in_threadpool(encode, samples, setup.sample_rate, setup.response_format)
            await self._send(data, samples.size, sent)
            return
        crossfader = StreamCrossfader(setup.deployment.overlap_samples)
        chunks = self.triton.stream(setup.deployment, arrays, parameters)
        try:
            async for chunk in chunks:
                piece = crossfader.push(chunk)
                await self._send(pcm16(piece), piece.size, sent)
        finally:
            await chunks.aclose()  # a client that has gone cancels the Triton request
        piece = crossfader.finish()
        await self._send(pcm16(piece), piece.size, sent)

    async def _send(self, data: bytes, samples: int, sent: Sent) -> None:
        await self.channel.audio(data)
        sent.bytes += len(data)
        sent.samples += samples
