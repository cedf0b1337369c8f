"""Thread stacks on demand: `kill -USR1 <pid of a model's triton_python_backend_stub>` prints the stack of
every thread of that model to the server log, to find out where a stuck request waits."""

from __future__ import annotations

import faulthandler
import signal
import sys


def enable_stack_dumps(signum: int = signal.SIGUSR1) -> None:
    """Also prints every thread's stack when the stub dies of a fatal signal (tritonserver logs nothing then)."""
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signum, file=sys.stderr, all_threads=True, chain=False)
