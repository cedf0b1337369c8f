"""Speak text as it is written: send it piece by piece over `WS /v1/audio/speech/stream`, write the audio to a WAV
and report the time to first audio.

    python examples/ws_client.py --voice default --text "Hello there. This is streamed text." --out hello.wav \
        [--text-file story.txt] [--tokens-per-second 20] [--url ws://localhost:8080/v1/audio/speech/stream] \
        [--model spark-tts] [--api-key KEY]

The text goes out at `--tokens-per-second` pieces a second, as an LLM writes it: a piece is a word with its
leading blank, or one CJK character.

Each sentence is synthesized as soon as it is complete; the audio (16-bit PCM, `stream_audio`) comes back while
the rest of the text is still being sent. Needs `pip install websockets`. Protocol: docs/streaming-text.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
import wave

import websockets

PIECE = re.compile(
    r"\s*[\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]|\s*[^\s\u3000-\u9fff\uac00-\ud7af\uff00-\uffef]+"
)


def pieces(text: str) -> list[str]:
    """The text as an LLM would write it: words with their leading blanks, CJK characters one by one."""
    return PIECE.findall(text)


async def speak(args: argparse.Namespace) -> int:
    config = {
        "type": "session.config",
        "voice": args.voice,
        "stream_audio": True,
        "split_granularity": "sentence",
    }
    if args.model:
        config["model"] = args.model
    if args.bistream:
        config["bistream"] = True  # CosyVoice2/3: every delta joins the running utterance
    if args.instructions:
        config["instructions"] = args.instructions
    if not args.text_normalization:
        config["text_normalization"] = False
    if args.api_key:
        config["api_key"] = args.api_key  # a browser cannot set headers on a WebSocket; this works everywhere
    pcm, rate, start, first_audio = bytearray(), 0, time.perf_counter(), None
    async with websockets.connect(args.url, max_size=None) as ws:
        await ws.send(json.dumps(config))

        async def write() -> None:
            for piece in pieces(args.text):
                await ws.send(json.dumps({"type": "input.text", "text": piece}))
                await asyncio.sleep(1.0 / args.tokens_per_second)
            await ws.send(json.dumps({"type": "session.close"}))  # speak the rest, then end the session

        writer = asyncio.create_task(write())
        try:
            async for message in ws:  # until the server closes: after session.close's session.done
                if isinstance(message, bytes):
                    if first_audio is None:
                        first_audio = time.perf_counter() - start
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
    print(
        f"wrote {args.out}: {len(pcm) // 2 / rate:.2f} s of audio; first audio {first_audio * 1e3:.0f} ms after the first text"
    )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default="ws://localhost:8080/v1/audio/speech/stream")
    p.add_argument("--model", default=None, help="the API's model name (default: the first one it serves)")
    p.add_argument("--voice", required=True)
    text = p.add_mutually_exclusive_group(required=True)
    text.add_argument("--text")
    text.add_argument("--text-file", help="a UTF-8 text file to speak instead of --text")
    p.add_argument("--out", default="speech.wav")
    p.add_argument("--api-key", default=os.environ.get("TRITONTTS_API_KEY"))
    p.add_argument("--tokens-per-second", type=float, default=20.0, help="pieces of text sent a second")
    p.add_argument(
        "--bistream",
        action="store_true",
        help="CosyVoice2/3: speak the text as it comes, not sentence by sentence",
    )
    p.add_argument("--instructions", help="how to speak (CosyVoice2/3's instruct mode)")
    p.add_argument(
        "--no-text-normalization",
        dest="text_normalization",
        action="store_false",
        help="send the text as written (the API normalizes numbers and symbols by default)",
    )
    args = p.parse_args()
    if args.tokens_per_second <= 0:
        p.error("--tokens-per-second must be positive")
    if args.text_file:
        args.text = open(args.text_file, encoding="utf-8").read()
    return asyncio.run(speak(args))


if __name__ == "__main__":
    raise SystemExit(main())
