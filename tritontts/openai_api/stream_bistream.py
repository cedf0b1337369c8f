"""A speech stream's bistream utterance (session.config `"bistream": true`, our extension; docs/streaming-text.md,
"Bistream"): the whole utterance is one streaming request to a CosyVoice BLS (request parameter
`bistream_session`), and every `input.text` delta is pushed to the server's `text_inbox` model as it comes, so the
LLM speaks while the text is still being written; `input.done` (or `session.close`) pushes `final`.

The BLS answers an empty first response once the session's inbox exists; deltas wait here until then and are
pushed in order, those that came meanwhile joined into one push. Messages: `audio.start` (`sentence_index` 0,
`sentence_text` "", `bistream: true`) when the utterance starts, its audio, `audio.done` with the utterance's
`text`. Closing the stream (the client left) cancels the request, and the BLS removes the inbox.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

import numpy as np
from fastapi.concurrency import run_in_threadpool

from tritontts.openai_api.encode import encode, pcm16
from tritontts.openai_api.errors import ApiError
from tritontts.openai_api.long_form import inputs
from tritontts.openai_api.stream_channel import Channel
from tritontts.openai_api.stream_config import StreamSetup
from tritontts.openai_api.triton_client import TritonTTS
from tritontts.streaming import StreamCrossfader

log = logging.getLogger("tritontts.openai_api.stream")
SESSION_PARAMETER = "bistream_session"
IDLE_PARAMETER = "bistream_idle_timeout_s"


class BistreamUtterance:
    def __init__(self, triton: TritonTTS, setup: StreamSetup, idle_timeout_s: float) -> None:
        self.triton, self.setup, self.idle_timeout_s = triton, setup, idle_timeout_s
        self.session = uuid.uuid4().hex
        self.text = ""
        self.pending: list[str] = []
        self.final = False
        self.ready = asyncio.Event()
        self.wake = asyncio.Event()

    def add(self, text: str) -> None:
        self.text += text
        self.pending.append(text)
        self.wake.set()

    def finish(self) -> None:
        self.final = True
        self.wake.set()

    async def _push(self) -> None:
        await self.ready.wait()
        while True:
            await self.wake.wait()
            self.wake.clear()
            if not self.pending and not self.final:
                continue
            text, final = "".join(self.pending), self.final
            self.pending.clear()
            await self.triton.push_text(self.setup.deployment, self.session, text, final)
            if final:
                return

    async def speak(self, channel: Channel, utterance: int) -> None:
        where = {"utterance_index": utterance, "sentence_index": 0}
        setup = self.setup
        start = {"type": "audio.start", **where, "sentence_text": "", "format": setup.response_format}
        await channel.json(start | {"sample_rate": setup.sample_rate, "bistream": True})
        arrays, parameters = inputs(setup.voice, "")
        parameters = {**parameters, SESSION_PARAMETER: self.session, IDLE_PARAMETER: self.idle_timeout_s}
        crossfader = StreamCrossfader(setup.deployment.overlap_samples)
        sent_bytes, samples, kept, failed = 0, 0, [], False
        pusher = asyncio.create_task(self._push())
        chunks = self.triton.stream(setup.deployment, arrays, parameters, keep_empty=True)
        try:
            async for chunk in chunks:
                if not self.ready.is_set():
                    self.ready.set()  # the inbox exists: the pushes may go
                    if not chunk.size:
                        continue
                piece = crossfader.push(chunk)
                samples += piece.size
                if setup.stream_audio:
                    data = pcm16(piece)
                    await channel.audio(data)
                    sent_bytes += len(data)
                else:
                    kept.append(piece)
            piece = crossfader.finish()
            samples += piece.size
            if setup.stream_audio:
                data = pcm16(piece)
                await channel.audio(data)
            else:
                audio = np.concatenate([*kept, piece]).astype(np.float32)
                data = await run_in_threadpool(encode, audio, setup.sample_rate, setup.response_format)
                await channel.audio(data)
            sent_bytes += len(data)
        except ApiError as err:
            failed = True
            log.warning("speech stream: bistream utterance %d failed: %s", utterance, err.message)
            await channel.error(err, **where)
        finally:
            await chunks.aclose()  # a client that has gone cancels the Triton request
            pusher.cancel()
            (outcome,) = await asyncio.gather(pusher, return_exceptions=True)
            if isinstance(outcome, Exception):
                log.warning("speech stream: a push to bistream session %s failed: %s", self.session, outcome)
        done = {
            "type": "audio.done",
            **where,
            "total_bytes": sent_bytes,
            "samples": samples,
            "text": self.text,
        }
        await channel.json(done | {"duration": round(samples / setup.sample_rate, 3), "error": failed})
