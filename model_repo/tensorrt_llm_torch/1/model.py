"""Our PyTorch engine behind the `tensorrt_llm` model's I/O contract.

One engine thread runs in-flight batching over every request `execute` hands it, and `execute` returns at
once: each request is answered from the engine thread through its response sender, so requests that arrive
while others decode join the running batch. Decoupled: tokens are sent as they are generated (`streaming`
true; past 16 running requests several steps' tokens per response, see `stream_interval`) or once at the end; a cancelled request frees its slot. Not decoupled (python_backend >= 24.06 lets a
default-mode model answer through the sender): exactly one response per request, carrying the FINAL flag.
"""

import dataclasses
import json
import time

import torch
import triton_python_backend_utils as pb_utils

from tritontts.devices import DTYPES
from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import FinishReason
from tritontts.llm.triton_io import parse_llm_request, response_arrays
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.first_chunk_priority import llm_pause_check
from tritontts.triton.instance_device import instance_device
from tritontts.triton.metrics import EngineGauges, release_metrics
from tritontts.triton.params import error_response, model_param, optional_input, parse_auto_bool
from tritontts.triton.stream_sender import Outbox
from tritontts.triton.stubs import end_stub_process
from tritontts.triton.token_coalescer import TokenCoalescer, auto_interval, parse_stream_interval

CANCEL_POLL_S = 0.02
"""How often a request's events ask whether its caller cancelled: each ask is a round trip to the server process,
one more per token beside the token's own response, on the thread that shares the GIL with the engine's."""


def _response(tokens):
    return pb_utils.InferenceResponse([pb_utils.Tensor(k, v) for k, v in response_arrays(tokens).items()])


class _Stream:
    """Sends one request's events from the engine thread."""

    def __init__(self, engine, request, parsed):
        self.engine, self.request, self.parsed = engine, request, parsed
        self.sender = request.get_response_sender()
        self.prefix = [] if parsed.exclude_input else list(parsed.prompt_ids)
        self.tokens = []
        self.request_id = None
        self.next_cancel_poll = 0.0

    def _cancelled(self):
        now = time.monotonic()
        if now < self.next_cancel_poll:
            return False
        self.next_cancel_poll = now + CANCEL_POLL_S
        return self.request.is_cancelled()

    def __call__(self, event):
        if not event.finished and self._cancelled():
            self.engine.cancel(event.request_id)
            return
        if event.finish_reason == FinishReason.ERROR:
            error = RuntimeError(f"generation failed: {event.error}")
            self.sender.send(
                error_response(pb_utils, error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
            return
        if self.parsed.streaming:
            if event.token_ids:
                self.sender.send(_response(self.prefix + event.token_ids))
                self.prefix = []
            if event.finished:
                self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        self.tokens += event.token_ids
        if event.finished:
            self.sender.send(
                _response(self.prefix + self.tokens), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        device = instance_device(args, model_param(config, "device", default="auto"))
        dtype_name = model_param(config, "dtype", default="auto")
        if dtype_name == "auto":
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        else:
            dtype = DTYPES[dtype_name]
        self.engine = LLMEngine.from_pretrained(
            model_param(config, "model_dir"),
            device=device,
            dtype=dtype,
            max_batch_size=model_param(config, "max_batch_size", int, default=16),
            max_seq_len=model_param(config, "max_seq_len", int, default=2560),
            cuda_graphs=model_param(config, "cuda_graphs", bool, default=True),
            compile=model_param(config, "compile", bool, default=False),
            decode_attention=model_param(config, "decode_attention", default="auto"),
            decode_linear=model_param(config, "decode_linear", default="auto"),
            decode_pdl=model_param(config, "decode_pdl", parse_auto_bool, default=None),
            output_tokens_from=model_param(config, "output_tokens_from", default=""),
        )
        fixed = parse_stream_interval(model_param(config, "stream_interval", default="auto"))
        running = self.engine.scheduler.running
        self.stream_interval = (lambda: fixed) if fixed else (lambda: auto_interval(len(running)))
        self.engine.pause_check = llm_pause_check(config, args, device)
        self.engine.start()
        self.gauges = EngineGauges(pb_utils, args["model_name"], self.engine)

    def _parse(self, request):
        get = lambda name: optional_input(pb_utils, request, name)  # noqa: E731
        parsed = parse_llm_request(get, self.engine.vocab_size, default_streaming=self.decoupled)
        # A default-mode model sends exactly one response per request: `streaming` cannot apply there.
        return parsed if self.decoupled else dataclasses.replace(parsed, streaming=False)

    def execute(self, requests):
        for request in requests:
            try:
                parsed = self._parse(request)
                # sent from a thread of the request's own: a sender that blocks never stalls the engine
                outbox = Outbox(_Stream(self.engine, request, parsed), lambda event: event.finished)
                on_tokens = TokenCoalescer(outbox, self.stream_interval) if parsed.streaming else outbox
                self.engine.add_request(parsed.prompt_ids, parsed.params, on_tokens)
            except Exception as err:
                sender = request.get_response_sender()
                sender.send(
                    error_response(pb_utils, err), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
        return None

    def finalize(self):
        release_metrics(self.gauges)
        self.engine.stop()
        if self.engine.pause_check is not None:
            self.engine.pause_check.close()
        end_stub_process()
