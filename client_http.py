#!/usr/bin/env python3
"""Synthesize one utterance with a TTS model served by Triton, over HTTP/JSON (offline models only).

    python client_http.py --server-url localhost:8000 --reference-audio prompt.wav \
        --reference-text "..." --target-text "..." --output-audio output.wav
    python client_http.py --model-name cosyvoice2 --use-spk2info-cache true --target-text "..."

The reference audio is resampled to 16 kHz and sent, like the returned waveform, as a binary tensor. With
--use-spk2info-cache true only target_text is sent: CosyVoice2 speaks as the cached speaker of its spk2info.pt.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import soundfile

from tritontts.bench import triton_io
from tritontts.voice_modes import add_mode_arguments, mode_arrays, mode_parameters

DEFAULT_REFERENCE_TEXT = "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。豆奶牛奶换着喝，营养更均衡，本节目由豆本豆豆奶特约播出。"
DEFAULT_TARGET_TEXT = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--server-url", default=None, help="host:port of Triton's HTTP endpoint (overrides addr/port)"
    )
    p.add_argument("--server-addr", default="localhost", help="Triton host")
    p.add_argument("--server-port", type=int, default=8000, help="Triton HTTP port")
    p.add_argument(
        "--model-name", default="spark_tts", help="Triton model to request (spark_tts, cosyvoice2)"
    )
    p.add_argument(
        "--reference-audio", default="../shared/data/prompt_zh.wav", help="the prompt WAV (any rate)"
    )
    p.add_argument("--reference-text", default=DEFAULT_REFERENCE_TEXT, help="the prompt's transcript")
    p.add_argument("--target-text", default=DEFAULT_TARGET_TEXT, help="the text to speak")
    p.add_argument(
        "--use-spk2info-cache",
        type=triton_io.true_or_false,
        default=False,
        help="true: send target_text only (CosyVoice2's cached speaker speaks); the reference is not read",
    )
    p.add_argument("--output-audio", default="output.wav", help="where the synthesized WAV goes")
    p.add_argument("--sample-rate", type=int, default=None, help="output sample rate; default by model name")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the response")
    add_mode_arguments(p)
    return p


def request_arrays(args: argparse.Namespace) -> dict:
    if args.use_spk2info_cache or args.gender:
        return triton_io.target_only_arrays(args.target_text)
    if not Path(args.reference_audio).is_file():
        raise FileNotFoundError(f"reference audio {args.reference_audio} not found")
    wav, rate = soundfile.read(args.reference_audio, dtype="float32", always_2d=True)
    samples = triton_io.reference_samples(wav[:, 0], int(rate))
    return triton_io.request_arrays(samples, args.reference_text, args.target_text)


def server_url(args: argparse.Namespace) -> str:
    url = args.server_url or f"{args.server_addr}:{args.server_port}"
    return url.removeprefix("http://").removeprefix("https://")


def synthesize(args: argparse.Namespace) -> tuple[float, float]:
    """Checks the server, sends the request, writes the WAV; returns (latency, audio seconds)."""
    import tritonclient.http as httpclient

    url = server_url(args)
    client = httpclient.InferenceServerClient(url=url, connection_timeout=10.0, network_timeout=args.timeout)
    try:
        triton_io.check_server(client, url, "HTTP", args.model_name, streaming=False)
        output_rate = triton_io.output_sample_rate(args.model_name, args.sample_rate)
        arrays, parameters = mode_arrays(args, request_arrays(args)), mode_parameters(args)
        start = time.perf_counter()
        result = client.infer(
            args.model_name,
            triton_io.infer_inputs(httpclient, arrays),
            outputs=triton_io.requested_outputs(httpclient),
            request_id="0",
            parameters=parameters or None,
        )
        latency = time.perf_counter() - start
    finally:
        client.close()
    audio = triton_io.waveform(result)
    soundfile.write(args.output_audio, audio, output_rate, subtype="PCM_16")
    return latency, audio.size / output_rate


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        latency, seconds = synthesize(args)
    except Exception as error:
        from tritonclient.utils import InferenceServerException

        if not isinstance(error, (triton_io.ServerCheckError, InferenceServerException, ValueError, OSError)):
            raise
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {message}", file=sys.stderr)
        return 2
    print(f"wrote {args.output_audio}: {seconds:.2f} s of audio, latency {latency * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
