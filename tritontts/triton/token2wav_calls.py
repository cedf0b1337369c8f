"""How the flow-based token2wav models (CosyVoice2's, the DiT's, CosyVoice3's) run the calls Triton hands them:
parse each request, run the valid calls in groups through `run_many`, and answer each request through its
response sender as soon as its group is done (a non-decoupled python model may; `execute` returns None).

The `first_chunks_first` parameter picks the groups:
- `true` (run.sh's default): the streams' first chunks of an execute run and are answered before its other calls,
  in groups of at most `group_max` (the largest batch a flow graph was captured for, which the flow runs at once
  anyway), so the first of them are answered while the rest run;
- `queue`: `execute` only queues the calls, and one worker thread runs them: the waiting first chunks, else the
  other calls in arrival order, at most `group_max` a group. A first chunk then waits for one group of later chunks
  at most, not for all the later chunks Triton batched before it;
- `false`: an execute's calls are one group.

A group's stage seconds are labelled `chunk="first"` when every call in it is a stream's first; with a `holder`,
the LLM on this GPU holds its steps while a group makes some stream's first chunk."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.stage_timer import StageTimer
from tritontts.triton.first_chunk_priority import FirstChunkHolder, holding
from tritontts.triton.metrics import StageSeconds
from tritontts.triton.params import ParameterError, error_response, model_param

log = logging.getLogger(__name__)
MODES = ("true", "queue", "false")
CLOSE_TIMEOUT_S = 60.0
DEFAULT_GROUP_MAX = 8


def first_chunks_first(config: dict[str, Any]) -> str:
    """The `first_chunks_first` parameter: true (default), queue or false."""
    mode = model_param(config, "first_chunks_first", default="true").strip().lower()
    if mode not in MODES:
        raise ParameterError(
            f"parameter 'first_chunks_first' must be one of {', '.join(MODES)}, got {mode!r}"
        )
    return mode


def group_max(graphs: FlowGraphConfig | None) -> int:
    """The most calls a group runs: as many as the largest batch a flow graph was captured for."""
    return max(graphs.batch_sizes) if graphs is not None else DEFAULT_GROUP_MAX


@dataclass
class _Pending:
    request: Any
    call: Any
    first: bool


class Token2WavCalls:
    """`execute(requests)` for a token2wav model's `execute`; `close()` in its `finalize` (it owns `holder`)."""

    def __init__(
        self,
        pb_utils: Any,
        parse: Callable[[Any], Any],
        run_many: Callable[[list[Any], StageTimer], Sequence[Any]],
        stages: StageSeconds,
        first_chunk: Callable[[Any], bool],
        respond: Callable[[Any], Any],
        holder: FirstChunkHolder | None = None,
        mode: str = "true",
        group_max: int = DEFAULT_GROUP_MAX,
        device: torch.device | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.pb_utils = pb_utils
        self.parse = parse
        self.run_many = run_many
        self.stages = stages
        self.first_chunk = first_chunk
        self.respond = respond
        self.holder = holder
        self.mode = mode
        self.group_max = max(1, group_max)
        self._cuda_index = _cuda_index(device)
        self._waiting: list[_Pending] = []
        self._wake = threading.Condition()
        self._closing = False
        self._worker: threading.Thread | None = None
        if mode == "queue":
            self._worker = threading.Thread(target=self._work, name="token2wav-calls", daemon=True)
            self._worker.start()

    def execute(self, requests: Sequence[Any]) -> None:
        pending = self._parse(requests)
        if self._worker is not None:
            with self._wake:
                self._waiting.extend(pending)
                self._wake.notify()
            return None
        for group in self._groups(pending):
            self._run(group)
        return None

    def close(self) -> None:
        """Runs the calls still queued and stops the worker, then gives up the holder's slot on the board."""
        if self._worker is not None:
            with self._wake:
                self._closing = True
                self._wake.notify()
            self._worker.join(CLOSE_TIMEOUT_S)
        if self.holder is not None:
            self.holder.close()

    def _parse(self, requests: Sequence[Any]) -> list[_Pending]:
        pending = []
        for request in requests:
            try:
                call = self.parse(request)
            except Exception as err:
                self._send(request, error_response(self.pb_utils, err))
                continue
            pending.append(_Pending(request, call, self.first_chunk(call)))
        return pending

    def _groups(self, pending: list[_Pending]) -> list[list[_Pending]]:
        firsts = [p for p in pending if p.first]
        others = [p for p in pending if not p.first]
        if self.mode == "false" or not firsts:
            return [pending] if pending else []
        groups = [firsts[i : i + self.group_max] for i in range(0, len(firsts), self.group_max)]
        return groups + [others] if others else groups

    def _take(self) -> list[_Pending]:
        """The next group of the queue: the oldest waiting first chunks, else the oldest calls, `group_max` at most."""
        group = ([p for p in self._waiting if p.first] or self._waiting)[: self.group_max]
        taken = {id(p) for p in group}
        self._waiting = [p for p in self._waiting if id(p) not in taken]
        return group

    def _work(self) -> None:
        try:
            if self._cuda_index is not None:
                torch.cuda.set_device(self._cuda_index)
        except Exception as err:
            log.exception(
                "token2wav: the calls' worker could not take GPU %s; every call gets this error",
                self._cuda_index,
            )
            self.run_many = partial(_refuse, err)
        while True:
            with self._wake:
                while not self._waiting and not self._closing:
                    self._wake.wait()
                if not self._waiting:
                    return
                group = self._take()
            self._run(group)

    def _run(self, group: list[_Pending]) -> None:
        firsts = [p.first for p in group]
        timer = StageTimer()
        try:
            with holding(self.holder, any(firsts)):
                results = self.run_many([p.call for p in group], timer)
            self.stages.add(timer.stages, chunk="first" if all(firsts) else "other")
        except Exception as err:
            results = [err] * len(group)
        for pending, result in zip(group, results):
            try:
                response = self.respond(result) if not isinstance(result, Exception) else None
            except Exception as err:
                result = err
            if isinstance(result, Exception):
                response = error_response(self.pb_utils, result)
            self._send(pending.request, response)

    def _send(self, request: Any, response: Any) -> None:
        """A failure to send (a request whose caller is gone) is logged; the other requests still get theirs."""
        try:
            request.get_response_sender().send(
                response, flags=self.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        except Exception:
            log.exception("token2wav: could not send the response of request %s", _request_id(request))


def _cuda_index(device: torch.device | None) -> int | None:
    """The GPU a worker thread makes its current one (a new thread starts on GPU 0): the instance's, or for a bare
    `cuda` the one current in the thread that builds Token2WavCalls."""
    if device is None or device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def _refuse(err: Exception, calls: Sequence[Any], timer: StageTimer) -> Sequence[Any]:
    raise err


def _request_id(request: Any) -> str:
    try:
        return request.request_id()
    except Exception:
        return "?"
