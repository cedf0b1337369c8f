"""The GPU soak's load generator (scripts/soak_traffic.py): mixed traffic on one or more speech APIs
(`python -m tritontts.openai_api`) at a total concurrency for a duration, asyncio and httpx.

Each worker goes round-robin over every (target, kind) pair, worker i starting at pair i, with kinds
(tritontts.bench.soak_windows.KINDS): a stream with the saved voice, a stream with a new voice (the reference
WAV base64 in `ref_audio`, its transcript in `ref_text`), a whole file, and a stream the client closes after its
first chunk (a cancellation: counted as cancelled, not as an error). Audio is 16-bit PCM (`response_format: pcm`;
streams `stream_format: audio`), so its length is its bytes over 2 x the model's sample rate (from `/health`).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tritontts.bench.soak_windows import KINDS, Record

SPEECH, VOICES = "/v1/audio/speech", "/v1/audio/voices"
TEXTS = (
    "The quick brown fox jumps over the lazy dog near the riverbank.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A long soak test keeps every model busy for a quarter of an hour.",
    "Streaming speech starts playing before the whole sentence is ready.",
)


@dataclass
class Target:
    name: str  # a label for the report
    url: str  # the API's base URL
    model: str  # the API model name clients send
    sample_rate: int = 0  # filled from /health

    @classmethod
    def parse(cls, spec: str) -> Target:
        """`NAME=URL` or `NAME=URL,MODEL` (MODEL defaults to NAME)."""
        name, sep, rest = spec.partition("=")
        url, _, model = rest.partition(",")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ValueError(f"--target must be NAME=URL or NAME=URL,MODEL (URL http://...), not '{spec}'")
        return cls(name, url.rstrip("/"), model or name)


@dataclass
class Voices:
    saved: str  # the saved voice's name
    reference: bytes | None = None  # WAV bytes of the new voice (also what `saved` is made from when missing)
    reference_text: str | None = None


def headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def ready_models(client: httpx.AsyncClient, target: Target, wait_s: float) -> dict:
    """/health's models once it answers 200 with the target's model ready, polled for up to `wait_s`."""
    end, last = time.monotonic() + wait_s, "no answer"
    while True:
        try:
            health = await client.get(f"{target.url}/health", timeout=10)
            models = health.json().get("models", {})
            if health.status_code == 200 and (models.get(target.model) or {}).get("ready", True):
                return models
            last = f"HTTP {health.status_code}: {health.text[:200]}"
        except (httpx.HTTPError, ValueError) as err:
            last = f"{type(err).__name__}: {err}"
        if time.monotonic() >= end:
            raise RuntimeError(f"{target.name}: {target.url} not ready after {wait_s} s ({last})")
        await asyncio.sleep(1)


async def prepare(client: httpx.AsyncClient, target: Target, voices: Voices, wait_s: float = 0) -> dict:
    """The target's sample rate from /health (waiting up to `wait_s` for it to be ready); its saved voice, added
    from the reference when missing."""
    models = await ready_models(client, target, wait_s)
    if target.model not in models:
        raise RuntimeError(
            f"{target.name}: model '{target.model}' is not served at {target.url} ({sorted(models)})"
        )
    target.sample_rate = int(models[target.model]["sample_rate"])
    listed = await client.get(f"{target.url}{VOICES}")
    listed.raise_for_status()
    if voices.saved in [v["id"] for v in listed.json()["data"]]:
        return {"voice": voices.saved, "added": False}
    if voices.reference is None or not voices.reference_text:
        raise RuntimeError(
            f"{target.name}: no voice '{voices.saved}' and no --reference-wav/--reference-text to add it"
        )
    added = await client.post(
        f"{target.url}{VOICES}",
        data={"name": voices.saved, "transcript": voices.reference_text},
        files={"audio_sample": ("reference.wav", voices.reference, "audio/wav")},
        timeout=600,
    )
    if added.status_code not in (201, 409):  # 409: another target's API shares the voices folder
        raise RuntimeError(
            f"{target.name}: adding voice '{voices.saved}' failed: {added.status_code} {added.text[:300]}"
        )
    return {"voice": voices.saved, "added": added.status_code == 201}


def body(target: Target, kind: str, voices: Voices, text: str) -> dict:
    fields: dict = {"model": target.model, "input": text, "response_format": "pcm"}
    if kind != "offline":
        fields["stream_format"] = "audio"
    if kind == "stream_new":
        fields["ref_audio"] = base64.b64encode(voices.reference or b"").decode()
        if voices.reference_text:
            fields["ref_text"] = voices.reference_text
    else:
        fields["voice"] = voices.saved
    return fields


async def one_request(
    client: httpx.AsyncClient, target: Target, kind: str, voices: Voices, text: str, t0: float, timeout: float
) -> Record:
    """One request of `kind`; never raises (a failure is a Record with outcome error)."""
    start = time.monotonic()
    status, first_ms, size = 0, None, 0

    def done(outcome: str, error: str = "") -> Record:
        total = (time.monotonic() - start) * 1000
        audio = size / 2 / target.sample_rate if target.sample_rate else 0.0
        first = None if kind == "offline" else first_ms  # a whole file's first bytes are no first chunk
        return Record(
            start - t0, target.name, kind, status, outcome, first, round(total, 1), round(audio, 3), error
        )

    async def exchange() -> Record | None:
        nonlocal status, first_ms, size
        request = client.build_request("POST", f"{target.url}{SPEECH}", json=body(target, kind, voices, text))
        response = await client.send(request, stream=True)
        try:
            status = response.status_code
            if status != 200:
                message = (await response.aread()).decode(errors="replace")
                return done("error", f"HTTP {status}: {message[:300]}")
            async for piece in response.aiter_raw():
                if not piece:
                    continue
                if first_ms is None:
                    first_ms = round((time.monotonic() - start) * 1000, 1)
                size += len(piece)
                if kind == "cancel":
                    return done("cancelled")  # closing the response closes the connection: the API cancels
        finally:
            await response.aclose()
        return None

    try:
        ended = await asyncio.wait_for(exchange(), timeout)
    except asyncio.TimeoutError:
        return done("error", f"timeout after {timeout} s")
    except httpx.HTTPError as err:
        return done("error", f"{type(err).__name__}: {err}"[:300])
    if ended is not None:
        return ended
    if size == 0:
        return done("error", "no audio")
    if kind == "cancel":
        return done("error", "the stream ended in its first chunk: nothing to cancel")
    return done("ok")


def plan(targets: list[Target], kinds: tuple[str, ...] = KINDS) -> list[tuple[Target, str]]:
    return [(t, k) for t in targets for k in kinds]


async def run_load(
    targets: list[Target],
    voices: Voices,
    concurrency: int,
    seconds: float,
    sink: Callable[[Record], None],
    api_key: str | None = None,
    timeout: float = 300.0,
    warmup: bool = True,
    kinds: tuple[str, ...] = KINDS,
    on_start: Callable[[float], None] | None = None,
    wait_s: float = 0,
) -> dict:
    """Drives the targets for `seconds` (no new request after that; those in flight finish), each finished
    request to `sink` (its start_s counted from the load's start, after the warm-up, which `on_start` is given as
    time.monotonic()); returns the preparation's and the warm-up's outcome."""
    if "stream_new" in kinds and voices.reference is None:
        raise ValueError("a new voice needs --reference-wav")
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(
        headers=headers(api_key), timeout=httpx.Timeout(timeout, connect=30), limits=limits
    ) as client:
        prepared = {t.name: await prepare(client, t, voices, wait_s) for t in targets}
        warm: list[dict] = []
        if warmup:  # every (target, kind) once, sequentially: the servers' first requests are not timed
            for target, kind in plan(targets, kinds):
                record = await one_request(client, target, kind, voices, TEXTS[0], time.monotonic(), timeout)
                warm.append(
                    {"target": target.name, "kind": kind, "outcome": record.outcome, "error": record.error}
                )
        start = time.monotonic()
        end = start + seconds
        if on_start is not None:
            on_start(start)
        pairs = plan(targets, kinds)

        async def worker(index: int) -> None:
            order = itertools.islice(itertools.cycle(pairs), index % len(pairs), None)
            texts = itertools.islice(itertools.cycle(TEXTS), index % len(TEXTS), None)
            while time.monotonic() < end:
                target, kind = next(order)
                sink(await one_request(client, target, kind, voices, next(texts), start, timeout))

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return {"prepared": prepared, "warmup": warm, "warmup_errors": sum(w["outcome"] == "error" for w in warm)}


def read_reference(path: Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()
