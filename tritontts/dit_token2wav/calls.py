"""What one execute of the `token2wav_dit` Triton model runs: its requests' speakers, then the whole utterances
together (`DiTToken2Wav.offline_many`) and the streams' calls together (`DiTToken2Wav.stream_many`), their flows
batched where the graphs allow.
A request that fails gets its exception in its place; a stream whose call failed is dropped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tritontts.dit_token2wav.speaker import DiTSpeaker
from tritontts.dit_token2wav.token2wav import DiTStreamCall, DiTToken2Wav
from tritontts.dit_token2wav.wire import DiTToken2WavInputs
from tritontts.stage_timer import StageTimer


@dataclass(frozen=True)
class DiTCall:
    """One request: its inputs and, for a stream's call, the request id that keys the stream."""

    inputs: DiTToken2WavInputs
    stream_id: str | None = None
    first_of_stream: bool = False


def run_calls(
    model: DiTToken2Wav, calls: Sequence[DiTCall], timer: StageTimer | None = None
) -> list[np.ndarray | Exception]:
    """Each call's audio or exception; `timer` gets "frontend" (the speakers), then "flow" and "vocoder"."""
    results: list[np.ndarray | Exception | None] = [None] * len(calls)
    speakers: list[DiTSpeaker | None] = [None] * len(calls)
    for i, call in enumerate(calls):
        try:
            speakers[i] = model.prepare_speaker(call.inputs.reference_wav)
        except Exception as err:
            results[i] = err
    if timer is not None:
        timer.mark("frontend")
    pending = [i for i in range(len(calls)) if results[i] is None]
    whole = [i for i in pending if calls[i].stream_id is None]
    streamed = [i for i in pending if calls[i].stream_id is not None]
    if whole:
        audios = model.offline_many([(calls[i].inputs.tokens, speakers[i]) for i in whole])
        for i, audio in zip(whole, audios):
            results[i] = audio
    stream_calls = [
        DiTStreamCall(calls[i].stream_id, speakers[i], calls[i].inputs.tokens, bool(calls[i].inputs.finalize))
        for i in streamed
    ]
    if not stream_calls:
        return results
    try:
        audios = model.stream_many(stream_calls, timer)
    except Exception:
        for call in stream_calls:
            model.cancel(call.request_id)
        raise
    for i, audio in zip(streamed, audios):
        if isinstance(audio, Exception):
            model.cancel(calls[i].stream_id)
        results[i] = audio
    return results
