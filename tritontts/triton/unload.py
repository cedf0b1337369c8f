"""How long a tritonserver needs to stop: `--exit-timeout-secs` sized to the model repository.

On SIGTERM tritonserver lets in-flight requests finish, then unloads every model, and exits with "failed to stop
server: Exit timeout expired" once `--exit-timeout-secs` (30 s by default) have passed. The python backend
unloads a model's instances one after another, each after a 1 s health check of its stub (`UpdateHealth`) and
the stub's exit: a BLS of 16 instances needs about 18 s on its own, one of 64 over a minute.
"""

from __future__ import annotations

import re
from pathlib import Path

REQUEST_GRACE_S = 30  # tritonserver's default: what in-flight requests get
UNLOAD_S_PER_INSTANCE = 2  # measured 1.1 s per BLS instance (CPU, stubs that end at finalize), with a margin

_GROUPS = re.compile(r"\binstance_group\s*\[")
_GROUP = re.compile(r"\{([^}]*)\}")
_COUNT = re.compile(r"\bcount\s*:\s*(\d+)")
_GPUS = re.compile(r"\bgpus\s*:\s*\[([^\]]*)\]")


def instances_in(config_text: str) -> int:
    """The model instances a config.pbtxt asks for (a group listing GPUs starts its count on each of them)."""
    total = 0
    for block in _blocks(config_text):
        for group in _GROUP.findall(block):
            count = _COUNT.search(group)
            gpus = _GPUS.search(group)
            listed = len([g for g in gpus.group(1).split(",") if g.strip()]) if gpus else 0
            total += (int(count.group(1)) if count else 1) * max(1, listed)
    return total or 1


def _blocks(text: str) -> list[str]:
    """The text inside each `instance_group [ ... ]`, nested brackets (a group's `gpus: [...]`) included."""
    blocks = []
    for match in _GROUPS.finditer(text):
        depth, start = 1, match.end()
        for end in range(start, len(text)):
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            if depth == 0:
                blocks.append(text[start:end])
                break
    return blocks


def exit_timeout_for(model_repo: str | Path) -> int:
    """Seconds for `--exit-timeout-secs`: the request grace plus the unload of the model with most instances."""
    configs = Path(model_repo).glob("*/config.pbtxt")
    most = max((instances_in(path.read_text()) for path in configs), default=1)
    return REQUEST_GRACE_S + UNLOAD_S_PER_INSTANCE * most


def exit_timeout_of(argv: list[str]) -> int | None:
    """The `--exit-timeout-secs` of a tritonserver command line, if it has one."""
    for arg in argv:
        if arg.startswith("--exit-timeout-secs="):
            return int(arg.split("=", 1)[1])
    return None
