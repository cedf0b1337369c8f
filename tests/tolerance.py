"""One check for every comparison against a reference output: the measured error, its bound, and a record.

`within(what, error, bound)` asserts `error < bound`. With `TRITONTTS_SPREAD_FILE` set, it also appends
one JSON line (test, what, error, bound, the CPU kernel path and torch's thread count) to that file:
`tests/golden_spread.py` runs the `golden` tests under every kernel path a machine offers and reads
those lines to show how far each comparison moves, which is what each bound is set from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def max_error(ours: torch.Tensor | np.ndarray, expected: torch.Tensor | np.ndarray) -> float:
    """The largest absolute difference, after checking that the shapes agree."""
    ours, expected = (
        x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in (ours, expected)
    )
    assert ours.shape == expected.shape, f"shape {ours.shape} != {expected.shape}"
    return float(np.abs(ours.astype(np.float64) - expected.astype(np.float64)).max())


def within(what: str, error: float, bound: float) -> None:
    path = os.environ.get("TRITONTTS_SPREAD_FILE")
    if path:
        record = {
            "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
            "what": what,
            "error": error,
            "bound": bound,
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
        }
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")
    assert error < bound, f"{what}: max error {error:.3g} is not below {bound:.3g}"


# The session's tritonserver runs its python models with this many torch threads (tests/conftest.py): a test
# that compares a served output with the same model run in the test process runs it with as many, so both take
# the same kernels and the comparison sees the wire, not a thread count (HiFT amplifies a 1e-7 difference in
# the mel to 1e-4 in the audio through the phase of its source).
SERVER_TORCH_THREADS = 2


@contextmanager
def server_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(SERVER_TORCH_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
