"""python -m tritontts.openai_api --triton-url localhost:8001 --voices-dir voices --port 8080 [--api-key KEY]"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from tritontts.openai_api.encode import missing_formats
from tritontts.openai_api.settings import DEFAULT_MODEL_SPEC, Settings, load_model_map, parse_model_spec
from tritontts.text.normalize import NormalizationUnavailable, check_available


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tritontts.openai_api", description=__doc__)
    p.add_argument("--triton-url", default="localhost:8001", help="Triton's gRPC address host:port")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--voices-dir", default="voices", help="NAME.wav + NAME.txt per voice; uploads go here too"
    )
    p.add_argument(
        "--model",
        action="append",
        default=None,
        metavar="NAME=TRITON_MODEL[,TRITON_MODEL][,sample_rate=HZ]",
        help=f"API model name and its Triton models, repeatable (default: {DEFAULT_MODEL_SPEC})",
    )
    p.add_argument(
        "--model-map", default=None, help="JSON/YAML file {name: {triton_models: [...], sample_rate: HZ}}"
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("TRITONTTS_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $TRITONTTS_API_KEY; none: no auth)",
    )
    p.add_argument(
        "--max-input-chars",
        type=int,
        default=20000,
        help="the longest input a speech request may have (400 naming `input` past it); longer than one BLS "
        "request takes (its max_text_length), it is cut into segments synthesized one after another",
    )
    p.add_argument("--max-request-bytes", type=int, default=1 << 20)
    p.add_argument("--max-upload-bytes", type=int, default=20 << 20)
    p.add_argument("--max-reference-seconds", type=float, default=30.0)
    p.add_argument(
        "--ws-config-timeout", type=float, default=10.0, help="speech stream: seconds to session.config"
    )
    p.add_argument(
        "--ws-idle-timeout", type=float, default=30.0, help="speech stream: idle seconds before it closes"
    )
    p.add_argument(
        "--ws-max-message-bytes", type=int, default=128 << 10, help="speech stream: longest message"
    )
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds one Triton request may take")
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="cap on the audio tokens one request may generate, sent to Triton as the max_new_tokens request "
        "parameter (the Spark-TTS BLS honours it, up to its own max_new_tokens); default: the BLS's own",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=0,
        help="speech requests this API runs at once; more are answered 429 with Retry-After (0: no limit)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=0.0,
        help="seconds a request may wait in Triton's queue before Triton rejects it (503 + Retry-After; 0: none)",
    )
    p.add_argument("--retry-after", type=int, default=2, help="Retry-After seconds of overload answers")
    p.add_argument(
        "--no-text-normalization",
        dest="text_normalization",
        action="store_false",
        help="send text as written unless a request asks for text_normalization (then wetext and inflect are "
        "not needed at startup); default: normalized (docs/text.md)",
    )
    p.add_argument(
        "--no-ui",
        dest="ui",
        action="store_false",
        help="do not serve the page for trying voices at /ui/ (docs/webui.md)",
    )
    p.add_argument("--log-level", default="info")
    return p


def settings_from_args(args: argparse.Namespace) -> Settings:
    if args.model_map:
        routes = load_model_map(args.model_map)
    else:
        routes = tuple(parse_model_spec(spec) for spec in args.model or [DEFAULT_MODEL_SPEC])
    return Settings(
        triton_url=args.triton_url,
        routes=routes,
        voices_dir=Path(args.voices_dir),
        api_key=args.api_key or None,
        max_input_chars=args.max_input_chars,
        max_request_bytes=args.max_request_bytes,
        max_upload_bytes=args.max_upload_bytes,
        ws_config_timeout_s=args.ws_config_timeout,
        ws_idle_timeout_s=args.ws_idle_timeout,
        ws_max_message_bytes=args.ws_max_message_bytes,
        max_reference_seconds=args.max_reference_seconds,
        request_timeout_s=args.request_timeout,
        max_new_tokens=args.max_new_tokens,
        max_concurrent_requests=args.max_concurrent_requests,
        queue_timeout_s=args.queue_timeout,
        retry_after_s=args.retry_after,
        text_normalization=args.text_normalization,
        ui=args.ui,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = get_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
        if settings.text_normalization:
            check_available()
    except (ValueError, OSError, NormalizationUnavailable) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    import uvicorn

    from tritontts.openai_api.app import create_app

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if missing_formats():
        logging.warning(
            "this libsndfile cannot write: %s (those requests will fail)", ", ".join(missing_formats())
        )
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
