"""The engine: requests in from any thread, one step at a time on one thread, tokens streamed back.

`step()` runs cancellations, one batched prefill of the waiting requests that fit into free slots (again
when some finished at their first token), then queues one decode step for all running requests (in-flight
batching: requests join and leave between steps) and, while the device runs it, hands out the tokens of the
previous step. The device thus runs one step ahead of the host: a request that ended at step t also ran
step t+1, whose token is dropped (its slot is released behind that step on the same stream). `start()` runs
steps on a background thread whenever there is work; `generate()` is a synchronous helper on top of either.
With a `pause_check`, the background thread holds steps while it says so (never while a request waits to be
admitted or cancelled), for another process's work on the same GPU; it first streams the step in flight.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from contextlib import contextmanager
from pathlib import Path

import torch

from tritontts.llm.loader import load_pretrained, output_token_id
from tritontts.llm.model import Qwen2ForCausalLM
from tritontts.llm.runner import ModelRunner, PendingTokens
from tritontts.llm.scheduler import Scheduler
from tritontts.llm.sequence import FinishReason, SamplingParams, Sequence, TokenEvent

log = logging.getLogger(__name__)

PauseCheck = Callable[[list[Sequence]], float]
"""given the running sequences, the seconds the next step may still wait (0: step now)"""
PAUSE_POLL_S = 0.001


class LLMEngine:
    def __init__(self, runner: ModelRunner, pause_check: PauseCheck | None = None):
        self.runner = runner
        self.pause_check = pause_check
        self.paused_s = 0.0
        """seconds the background thread held steps for `pause_check`"""
        self.vocab_size = runner.model.config.vocab_size
        self.scheduler = Scheduler(runner.max_batch_size)
        self._inbox: list[Sequence] = []
        self._cancels: set[int] = set()
        self._wake = threading.Condition()
        self._ids = itertools.count()
        self._seeds = random.Random()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._inflight: tuple[list[Sequence], PendingTokens] | None = None  # engine thread only

    @classmethod
    def from_model(cls, model: Qwen2ForCausalLM, **runner_options) -> LLMEngine:
        return cls(ModelRunner(model, **runner_options))

    @classmethod
    def from_pretrained(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "cuda",
        dtype: torch.dtype | None = None,
        max_batch_size: int = 16,
        max_seq_len: int = 2560,
        cuda_graphs: bool = True,
        compile: bool = False,
        max_top_k: int = 1024,
        max_prefill_tokens: int = 8192,
        decode_attention: str = "auto",
        decode_linear: str = "auto",
        top_k_kernel: str = "auto",
        output_tokens_from: int | str = 0,
        decode_pdl: bool | None = None,
    ) -> LLMEngine:
        """`output_tokens_from`: the first id the model may output, or the token there (`<|s_0|>`): see
        ModelRunner."""
        start = output_token_id(model_dir, output_tokens_from)
        model = load_pretrained(model_dir, device, dtype)
        return cls.from_model(
            model,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            cuda_graphs=cuda_graphs,
            compile=compile,
            max_top_k=max_top_k,
            max_prefill_tokens=max_prefill_tokens,
            decode_attention=decode_attention,
            decode_linear=decode_linear,
            top_k_kernel=top_k_kernel,
            output_tokens_from=start,
            decode_pdl=decode_pdl,
        )

    def add_request(
        self,
        prompt_ids: Seq[int],
        params: SamplingParams | None = None,
        on_tokens: Callable[[TokenEvent], None] | None = None,
        request_id: int | None = None,
    ) -> int:
        """Queue a request (thread-safe); `on_tokens` gets its TokenEvents on the engine's thread."""
        params = params or SamplingParams()
        prompt = [int(t) for t in prompt_ids]
        max_seq_len = self.runner.max_seq_len
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_seq_len {max_seq_len}")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        if any(t >= self.vocab_size for t in params.bad_token_ids):
            raise ValueError(f"bad_token_ids must be in [0, {self.vocab_size})")
        start = self.runner.output_start
        if start and params.end_id is not None and not start <= params.end_id < self.vocab_size:
            raise ValueError(
                f"end_id {params.end_id} is not an id this engine outputs: [{start}, {self.vocab_size})"
            )
        if len(params.bad_token_ids) > self.runner.state.max_bad_tokens:
            raise ValueError(
                f"at most {self.runner.state.max_bad_tokens} bad_token_ids, got {len(params.bad_token_ids)}"
            )
        seq = Sequence(
            request_id=next(self._ids) if request_id is None else request_id,
            prompt_ids=prompt,
            params=params,
            seed=self._seeds.getrandbits(63) if params.seed is None else params.seed,
            max_tokens=min(params.max_tokens, max_seq_len - len(prompt)),
            on_tokens=on_tokens,
        )
        with self._wake:
            self._inbox.append(seq)
            self._wake.notify()
        return seq.request_id

    def cancel(self, request_id: int) -> None:
        """Thread-safe; the request stops at the next step boundary with FinishReason.CANCELLED."""
        with self._wake:
            self._cancels.add(request_id)
            self._wake.notify()

    def has_work(self) -> bool:
        with self._wake:
            return bool(self._inbox or self._cancels or len(self.scheduler) or self._inflight)

    def step(self) -> list[Sequence]:
        """One engine step; returns the sequences that finished in it."""
        with self._wake:
            new, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, set()
        for seq in new:
            self.scheduler.add(seq)
        with self._failing_all_on_error():
            return self._step(cancels)

    @contextmanager
    def _failing_all_on_error(self) -> Iterator[None]:
        """An exception inside finishes every request with it (then propagates)."""
        try:
            yield
        except Exception as error:
            self._fail_all(FinishReason.ERROR, f"{type(error).__name__}: {error}")
            raise

    def _step(self, cancels: set[int]) -> list[Sequence]:
        finished: list[Sequence] = []
        cancelled = [s for s in map(self.scheduler.find, cancels) if s is not None]
        for seq in cancelled:
            seq.finish_reason = FinishReason.CANCELLED
        finished += self._retire({seq: [] for seq in cancelled})
        while admitted := list(iter(self.scheduler.admit, None)):
            tokens = self.runner.prefill_batch(
                admitted[0].slot,
                [s.prompt_ids for s in admitted],
                [s.params for s in admitted],
                [s.seed for s in admitted],
            )
            finished += self._retire(self._deliver(admitted, tokens.tolist()))
        previous, self._inflight = self._inflight, None
        running = self.scheduler.running
        if running:
            # Sequences of the previous step are one token longer on the device than here.
            kv_len = max(s.length for s in running) + (previous is not None)
            candidates = self.runner.candidates(s.params for s in running)
            self._inflight = (list(running), self.runner.decode_async(len(running), kv_len, candidates))
        return finished + self._deliver_step(previous)

    def _deliver_step(self, launched: tuple[list[Sequence], PendingTokens] | None) -> list[Sequence]:
        """Streams the tokens of a launched step once the device has them; returns the sequences it finished."""
        if launched is None:
            return []
        seqs, pending = launched
        live = [(s, t) for s, t in zip(seqs, pending.wait()) if s.finish_reason is None]
        return self._retire(self._deliver([s for s, _ in live], [t for _, t in live]))

    def _deliver_inflight(self) -> None:
        """The step in flight's tokens out, no new step launched (before a hold: a stream that ended in it
        finishes now, not after the hold)."""
        launched, self._inflight = self._inflight, None
        with self._failing_all_on_error():
            self._deliver_step(launched)

    def _deliver(self, seqs: list[Sequence], tokens: list[int]) -> dict[Sequence, list[int]]:
        """Stream each sequence's new token; return the finished ones with their last tokens."""
        done = {}
        now = time.monotonic()
        for seq, token in zip(seqs, tokens):
            if seq.first_token_at is None:
                seq.first_token_at = now
            new = seq.accept(token)
            if seq.finish_reason is not None:
                done[seq] = new
            else:
                self._emit(seq, TokenEvent(seq.request_id, new))
        return done

    def _retire(self, done: dict[Sequence, list[int]]) -> list[Sequence]:
        order = sorted(done, key=lambda s: -1 if s.slot is None else s.slot, reverse=True)
        for seq in order:
            had_slot = seq.slot is not None
            move = self.scheduler.release(seq)
            if move is not None:
                src, dst = move
                self.runner.move_slot(src, dst, self.scheduler.running[dst].length)
            if had_slot:
                self.runner.free_slot(len(self.scheduler.running))
            self._emit(seq, TokenEvent(seq.request_id, done[seq], seq.finish_reason, seq.error))
        return order

    def _emit(self, seq: Sequence, event: TokenEvent) -> None:
        if seq.on_tokens is None:
            return
        try:
            seq.on_tokens(event)
        except Exception:
            log.exception("on_tokens of request %s failed; cancelling it", seq.request_id)
            if not event.finished:
                self.cancel(seq.request_id)

    def _fail_all(self, reason: FinishReason, error: str | None) -> None:
        self._inflight = None
        seqs = [*self.scheduler.running, *self.scheduler.waiting]
        self.scheduler.running.clear()
        self.scheduler.waiting.clear()
        for slot in range(self.runner.max_batch_size):
            self.runner.free_slot(slot)
        for seq in seqs:
            seq.slot = None
            seq.finish_reason, seq.error = reason, error
            self._emit(seq, TokenEvent(seq.request_id, [], reason, error))

    def generate(
        self, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams] | None = None
    ) -> list[list[int]]:
        """Generated token ids for each prompt (end token excluded); runs steps itself unless started."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        outputs: dict[int, list[int]] = {}
        remaining = threading.Semaphore(0)

        def collect(event: TokenEvent) -> None:
            outputs[event.request_id] += event.token_ids
            if event.finished:
                if event.finish_reason == FinishReason.ERROR:
                    log.error("request %s failed: %s", event.request_id, event.error)
                remaining.release()

        ids = []
        for prompt, p in zip(prompts, params_list, strict=True):
            request_id = next(self._ids)
            outputs[request_id] = []
            ids.append(self.add_request(prompt, p, collect, request_id))
        if self._thread is None:
            while self.has_work():
                self.step()
        for _ in ids:
            remaining.acquire()
        return [outputs[i] for i in ids]

    def start(self) -> None:
        """Serve steps on a background thread until `stop()`."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="llm-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; requests still queued or running finish as cancelled."""
        if self._thread is None:
            return
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        self._thread = None
        with self._wake:
            new, self._inbox = self._inbox, []
        for seq in new:
            self.scheduler.add(seq)
        self._fail_all(FinishReason.CANCELLED, None)

    def _hold_s(self) -> float:
        """Under `_wake`: the seconds `pause_check` asks the next step to wait; 0 while a request waits to be
        admitted or cancelled."""
        if self.pause_check is None or self._inbox or self._cancels or self.scheduler.waiting:
            return 0.0
        return self.pause_check(self.scheduler.running)

    def _hold(self, hold_s: float) -> None:
        """Under `_wake`: waits a moment of the hold (a new request or a cancellation ends it at once)."""
        start = time.monotonic()
        self._wake.wait(min(hold_s, PAUSE_POLL_S))
        self.paused_s += time.monotonic() - start

    def _serve(self) -> None:
        device = self.runner.device
        if device.type == "cuda" and device.index is not None:  # a new thread starts on GPU 0
            torch.cuda.set_device(device)
        while True:
            with self._wake:
                while not (
                    self._stopping or self._inbox or self._cancels or len(self.scheduler) or self._inflight
                ):
                    self._wake.wait()
                if self._stopping:
                    return
                hold_s = self._hold_s()
                if hold_s > 0 and self._inflight is None:
                    self._hold(hold_s)
                    continue
            try:
                if hold_s > 0:
                    self._deliver_inflight()
                else:
                    self.step()
            except Exception:
                log.exception("engine step failed; its requests were finished with an error")
