"""Time to first audio over the speech WebSocket (`WS /v1/audio/speech/stream`, docs/streaming-text.md) with the
text written at a set rate, as an LLM writes it: N sessions at once, each one utterance.

A session sends its `session.config`, waits for `session.created`, then sends the text piece by piece (a word
with its leading blank, or one CJK character) at `pieces_per_second`, then `session.close`. Its time to first
audio runs from the first `input.text` sent to the first binary audio frame received; its audio is every frame's
bytes (16-bit PCM). An `error` event, a close before `session.done` or no audio at all fails the session.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

import websockets

from tritontts.bench.stats import percentile

PIECE = re.compile(
    r"\s*[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]|\s*[^\s\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]+"
)


def pieces(text: str) -> list[str]:
    """The text as an LLM would write it: words with their leading blanks, CJK characters one by one."""
    return PIECE.findall(text)


@dataclass(frozen=True)
class WsLoad:
    url: str
    """ws://host:port/v1/audio/speech/stream"""
    config: dict
    """the session.config message's fields besides `type` (model, voice, bistream, ...)"""
    text: str
    pieces_per_second: float = 20.0
    timeout_s: float = 300.0


@dataclass
class SessionResult:
    first_audio_ms: float | None = None
    audio_bytes: int = 0
    sample_rate: int = 0
    error: str | None = None

    @property
    def audio_seconds(self) -> float:
        return self.audio_bytes / 2 / self.sample_rate if self.sample_rate else 0.0


@dataclass
class LevelResult:
    concurrency: int
    sessions: list[SessionResult] = field(default_factory=list)
    wall_s: float = 0.0

    def summary(self) -> dict:
        ok = [s.first_audio_ms for s in self.sessions if s.error is None and s.first_audio_ms is not None]
        errors = [s.error for s in self.sessions if s.error is not None]
        return {
            "concurrency": self.concurrency,
            "sessions": len(self.sessions),
            "failed": len(errors),
            "errors": errors[:20],
            "first_audio_ms": {
                **{f"p{q}": round(percentile(ok, q), 1) if ok else None for q in (50, 90, 99)},
                "all": sorted(round(ms, 1) for ms in ok),
            },
            "audio_seconds": round(sum(s.audio_seconds for s in self.sessions), 3),
            "wall_s": round(self.wall_s, 3),
        }


async def one_session(load: WsLoad) -> SessionResult:
    result = SessionResult()
    try:
        async with asyncio.timeout(load.timeout_s):
            async with websockets.connect(load.url, max_size=None) as ws:
                await ws.send(json.dumps({"type": "session.config", **load.config}))
                created = json.loads(await ws.recv())
                if created.get("type") != "session.created":
                    result.error = f"no session.created: {created}"
                    return result
                result.sample_rate = int(created["sample_rate"])
                started = time.perf_counter()
                writer = asyncio.create_task(write(ws, load))
                try:
                    await read(ws, result, started)
                finally:
                    writer.cancel()
    except TimeoutError:
        result.error = f"no end within {load.timeout_s:.0f} s"
    except (OSError, websockets.WebSocketException) as err:
        result.error = result.error or f"{type(err).__name__}: {err}"
    if result.error is None and result.audio_bytes == 0:
        result.error = "no audio"
    return result


async def write(ws, load: WsLoad) -> None:
    for piece in pieces(load.text):
        await ws.send(json.dumps({"type": "input.text", "text": piece}))
        await asyncio.sleep(1.0 / load.pieces_per_second)
    await ws.send(json.dumps({"type": "session.close"}))


async def read(ws, result: SessionResult, started: float) -> None:
    async for message in ws:
        if isinstance(message, bytes):
            if result.first_audio_ms is None:
                result.first_audio_ms = (time.perf_counter() - started) * 1e3
            result.audio_bytes += len(message)
            continue
        event = json.loads(message)
        if event.get("type") == "error":
            result.error = f"{event.get('code')}: {event.get('message')}"
            return
        if event.get("type") == "session.done":
            return
    result.error = "closed before session.done"


async def run_level(load: WsLoad, concurrency: int) -> LevelResult:
    level = LevelResult(concurrency)
    started = time.perf_counter()
    level.sessions = list(await asyncio.gather(*(one_session(load) for _ in range(concurrency))))
    level.wall_s = time.perf_counter() - started
    return level


def run_levels(load: WsLoad, levels: list[int], rounds: int = 1, warmup: int = 1) -> list[LevelResult]:
    """`warmup` single sessions (not counted), then per level `rounds` rounds of that many sessions at once."""

    async def main() -> list[LevelResult]:
        for _ in range(warmup):
            await one_session(load)
        out = []
        for concurrency in levels:
            merged = LevelResult(concurrency)
            for _ in range(rounds):
                level = await run_level(load, concurrency)
                merged.sessions += level.sessions
                merged.wall_s += level.wall_s
            out.append(merged)
        return out

    return asyncio.run(main())
