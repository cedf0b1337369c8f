"""Speak text as it is written: send it word by word over `WS /v1/audio/speech/stream`, write the audio to a WAV.

    python examples/ws_client.py --voice default --text "Hello there. This is streamed text." --out hello.wav \
        [--url ws://localhost:8080/v1/audio/speech/stream] [--model spark-tts] [--api-key KEY] [--delay 0.05]

Each sentence is synthesized as soon as it is complete; the audio (16-bit PCM, `stream_audio`) comes back while
the rest of the text is still being sent. Needs `pip install websockets`. Protocol: docs/streaming-text.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import wave

import websockets


async def speak(args: argparse.Namespace) -> int:
    config = {
        "type": "session.config",
        "voice": args.voice,
        "stream_audio": True,
        "split_granularity": "sentence",
    }
    if args.model:
        config["model"] = args.model
    if args.api_key:
        config["api_key"] = args.api_key  # a browser cannot set headers on a WebSocket; this works everywhere
    pcm, rate, start = bytearray(), 0, time.perf_counter()
    async with websockets.connect(args.url, max_size=None) as ws:
        await ws.send(json.dumps(config))

        async def write() -> None:
            for i, word in enumerate(args.text.split(" ")):
                await ws.send(json.dumps({"type": "input.text", "text": word if i == 0 else " " + word}))
                await asyncio.sleep(args.delay)
            await ws.send(json.dumps({"type": "session.close"}))  # speak the rest, then end the session

        writer = asyncio.create_task(write())
        try:
            async for message in ws:  # until the server closes: after session.close's session.done
                if isinstance(message, bytes):
                    pcm += message
                    continue
                event = json.loads(message)
                print(f"{time.perf_counter() - start:6.2f} s  {event}")
                if event["type"] == "session.created":
                    rate = event["sample_rate"]
        except websockets.ConnectionClosedError as err:
            print(f"closed: {err}")  # 1008: a wrong key, or no valid session.config in time
        writer.cancel()
    if not pcm:
        return 1
    with wave.open(args.out, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(pcm))
    print(f"wrote {args.out}: {len(pcm) // 2 / rate:.2f} s")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="ws://localhost:8080/v1/audio/speech/stream")
    p.add_argument("--model", default=None, help="the API's model name (default: the first one it serves)")
    p.add_argument("--voice", required=True)
    p.add_argument("--text", required=True)
    p.add_argument("--out", default="speech.wav")
    p.add_argument("--api-key", default=os.environ.get("TRITONTTS_API_KEY"))
    p.add_argument("--delay", type=float, default=0.05, help="seconds between words, as an LLM writes them")
    return asyncio.run(speak(p.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
