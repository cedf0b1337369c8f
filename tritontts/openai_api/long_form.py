"""A speech request's text as segments (tritontts.text), synthesized one after another with one voice.

The API runs the text front end, not the BLS: it needs the normalized text to cut it, and sends every segment
with the request parameter `text_normalization: false`, so nothing is normalized twice (a BLS of upstream's,
which has no such parameter, ignores it). The voice's transcript is normalized here too, as upstream normalizes
its prompt text. Segments are at most the BLS's `max_text_length` characters long (Deployment).

Segments are made lazily in a worker thread: the first is ready once the first block of the text is normalized,
and a stream asks Triton for the next segment only when the one before has ended, so one segment is in flight and
no audio is kept beyond the cross-fader's tail.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import numpy as np
from fastapi.concurrency import run_in_threadpool

from tritontts.openai_api.voice_request import TritonVoice
from tritontts.streaming import StreamCrossfader
from tritontts.text import TextConfig, TextNormalizer, text_segments

TEXT_PARAMETER = "text_normalization"
"""the BLS request parameter that turns its own normalization off or on for one request"""


def _text(value: str) -> np.ndarray:
    return np.array([[value.encode("utf-8")]], dtype=object)


class SpeechText:
    """One request's text: its segments in order (`next`), and the voice inputs for each (`inputs`)."""

    def __init__(self, text: str, normalizer: TextNormalizer, normalize: bool, max_chars: int) -> None:
        self.normalizer = normalizer
        self.normalize = normalize
        config = TextConfig(normalize=normalize, max_segment_chars=max_chars)
        self._segments = text_segments(text, normalizer, config)
        self.served = 0
        """segments handed out so far"""

    async def next(self) -> str | None:
        """The next segment, or None after the last."""
        segment = await run_in_threadpool(next, self._segments, None)
        self.served += segment is not None
        return segment

    async def voice(self, sent: TritonVoice) -> TritonVoice:
        """`sent` with its transcript normalized (when normalizing) and the BLS's normalization off."""
        arrays = dict(sent.arrays)
        transcript = arrays.get("reference_text")
        if self.normalize and transcript is not None:
            value = transcript.reshape(-1)[0]
            text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
            arrays["reference_text"] = _text(await run_in_threadpool(self.normalizer.normalize, text) or text)
        return replace(sent, arrays=arrays, parameters={**sent.parameters, TEXT_PARAMETER: False})


def inputs(sent: TritonVoice, segment: str) -> tuple[dict[str, np.ndarray], dict]:
    """The Triton inputs and parameters of one segment with the request's voice."""
    return sent.arrays | {"target_text": _text(segment)}, sent.parameters


async def segment_samples(
    first: np.ndarray,
    chunks: AsyncIterator[np.ndarray],
    overlap: int,
    next_segment: Callable[[], object],
    open_stream: Callable[[str], AsyncIterator[np.ndarray]],
) -> AsyncIterator[np.ndarray]:
    """The audio of every segment in order, as it comes: `first` and `chunks` are the first segment's stream
    (its first chunk already read), cross-faded within each segment (Triton's chunks overlap) and joined end to
    end between segments; the next segment's stream is opened once the one before has ended."""
    while True:
        crossfader = StreamCrossfader(overlap)
        try:
            yield crossfader.push(first)
            async for chunk in chunks:
                yield crossfader.push(chunk)
            yield crossfader.finish()
        finally:
            await chunks.aclose()
        segment = await next_segment()
        if segment is None:
            return
        chunks, first = open_stream(segment), np.zeros(0, dtype=np.float32)
