"""Instance groups that span GPUs: one tritonserver runs a model's instances on each of several GPUs.

`spread_over_gpus` turns a filled config's one `instance_group [ { count: N, kind: KIND_CPU } ]` into
`{ count: N, kind: KIND_GPU, gpus: [...] }`: Triton starts N instances on every listed GPU and tells each its
GPU, which the python models use (tritontts.triton.instance_device). The GPU indices are those the server sees
(run.sh starts it with CUDA_VISIBLE_DEVICES set to its `--gpus`, so `--gpus 2,3` lists 0 and 1).

    python -m tritontts.triton.instance_group CONFIG.pbtxt --gpus 0,1   # in place
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

CPU_GROUP = re.compile(r"^instance_group\s*\[\s*\{\s*count:\s*(\d+)\s*,?\s*kind:\s*KIND_CPU\s*\}\s*\]", re.M)


def parse_gpus(text: str) -> list[int]:
    """`0,1,3` → [0, 1, 3]: distinct GPU indices, comma-separated."""
    if not re.fullmatch(r"\d+(,\d+)*", text):
        raise ValueError(f"GPUs must be comma-separated indices such as 0,1, got {text!r}")
    gpus = [int(part) for part in text.split(",")]
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"GPUs must be distinct, got {text!r}")
    return gpus


def spread_over_gpus(config: str, gpus: Sequence[int]) -> str:
    """`config` with its single KIND_CPU instance group made a KIND_GPU group of the same count on `gpus`."""
    if not gpus:
        raise ValueError("at least one GPU")
    match = CPU_GROUP.search(config)
    if match is None:
        raise ValueError("the config has no 'instance_group [ { count: N, kind: KIND_CPU } ]' block")
    listed = ", ".join(str(gpu) for gpu in gpus)
    group = f"instance_group [\n  {{ count: {match.group(1)}, kind: KIND_GPU, gpus: [ {listed} ] }}\n]"
    return config[: match.start()] + group + config[match.end() :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", type=Path, nargs="+", help="filled config.pbtxt files, rewritten in place")
    parser.add_argument("--gpus", required=True, help="comma-separated GPU indices the server sees")
    args = parser.parse_args(argv)
    try:
        gpus = parse_gpus(args.gpus)
    except ValueError as err:
        parser.error(f"--gpus: {err}")
    for path in args.configs:
        try:
            path.write_text(spread_over_gpus(path.read_text(), gpus))
        except ValueError as err:
            parser.error(f"{path}: {err}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
