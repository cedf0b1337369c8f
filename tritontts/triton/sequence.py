"""Routing each token2wav stream to one of several instances with Triton's sequence batcher.

A stream's token2wav state lives in the instance that served its first call. With one instance the dynamic
batcher is enough; with several, `use_sequence_batching` turns a filled config's `dynamic_batching` block into a
`sequence_batching` block with the Oldest strategy, which sends every request of a correlation id to the same
instance and still batches requests of different streams. The BLS marks each call (`call_flags`): the first call
of a stream starts its sequence, the finalize call ends it, and an offline call is a sequence of one.

    python -m tritontts.triton.sequence CONFIG.pbtxt [--max-candidates N] [--idle-seconds S]   # in place
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

SEQUENCE_START, SEQUENCE_END = 1, 2
"""TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END of tritonserver.h (pb_utils does not export them)"""

DYNAMIC_BLOCK = re.compile(r"^dynamic_batching\s*\{\s*max_queue_delay_microseconds:\s*(\d+)\s*\}", re.M)


def call_flags(token_offset: int | None, finalize: bool | None) -> int:
    """The sequence flags of one token2wav call: offline (offset None) starts and ends its own sequence."""
    if token_offset is None:
        return SEQUENCE_START | SEQUENCE_END
    return (SEQUENCE_START if token_offset == 0 else 0) | (SEQUENCE_END if finalize else 0)


def use_sequence_batching(config: str, max_candidates: int = 64, idle_seconds: float = 120.0) -> str:
    """`config` with its `dynamic_batching { max_queue_delay_microseconds: N }` block replaced by an Oldest
    sequence batcher with the same queue delay; `idle_seconds` frees a sequence whose stream went quiet."""
    if max_candidates < 1 or idle_seconds <= 0:
        raise ValueError("max_candidates must be at least 1 and idle_seconds positive")
    match = DYNAMIC_BLOCK.search(config)
    if match is None:
        raise ValueError("the config has no 'dynamic_batching { max_queue_delay_microseconds: N }' block")
    block = (
        "sequence_batching {\n"
        f"  max_sequence_idle_microseconds: {int(idle_seconds * 1e6)}\n"
        f"  oldest {{ max_candidate_sequences: {max_candidates} max_queue_delay_microseconds: {match.group(1)} }}\n"
        "}"
    )
    return config[: match.start()] + block + config[match.end() :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument(
        "--max-candidates", type=int, default=64, help="streams batched together per instance"
    )
    parser.add_argument("--idle-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    text = args.config.read_text()
    args.config.write_text(use_sequence_batching(text, args.max_candidates, args.idle_seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
