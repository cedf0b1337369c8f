"""Step-Audio-2-mini DiT token2wav, wire-compatible with upstream's `token2wav_dit` model.

The speaker (prompt tokens, x-vector, prompt mel, flow caches) is prepared from the reference audio once and
cached by its content. With `finalize`, one call of a stream keyed by the request id; without, a whole utterance.
The calls of one execute (its streams' chunks, and its whole utterances) share batched flow calls where the
graphs have batch sizes above 1.
"""

import json

import triton_python_backend_utils as pb_utils

from tritontts.audio import AudioLimits
from tritontts.dit_token2wav.calls import DiTCall, run_calls
from tritontts.dit_token2wav.token2wav import DiTToken2Wav
from tritontts.dit_token2wav.wire import parse_dit_token2wav_inputs
from tritontts.stream_states import DEFAULT_IDLE_TIMEOUT_S
from tritontts.triton.batched_flow import flow_placement
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.first_chunk_priority import first_chunk_holder
from tritontts.triton.metrics import OpenStreamsGauge, release_metrics, token2wav_stage_seconds
from tritontts.triton.params import (
    RequestError,
    model_param,
    optional_input,
    single_instance_stream,
    stream_instances,
)
from tritontts.triton.stubs import end_stub_process
from tritontts.triton.token2wav_calls import Token2WavCalls, first_chunks_first, group_max

INPUT_NAMES = ("target_speech_tokens", "reference_wav", "reference_wav_len", "finalize")


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        device, dtype, graphs = flow_placement(config, args, default_batch_sizes="1")
        self.model = DiTToken2Wav.from_model_dir(
            model_param(config, "model_dir"),
            device=device,
            dtype=dtype,
            flow_graphs=graphs,
            stream_idle_timeout_s=model_param(config, "stream_idle_timeout_s", float, DEFAULT_IDLE_TIMEOUT_S),
        )
        self.calls = Token2WavCalls(
            pb_utils,
            self._call,
            lambda calls, timer: run_calls(self.model, calls, timer),
            token2wav_stage_seconds(pb_utils, args),
            lambda call: call.first_of_stream,
            lambda audio: pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))]),
            first_chunk_holder(config, args, device),
            first_chunks_first(config),
            group_max(graphs),
            device,
        )
        self.open_streams = OpenStreamsGauge(pb_utils, args, lambda: self.model.open_streams)
        self.instances = stream_instances(config)
        self.limits = AudioLimits(
            max_seconds=model_param(config, "max_reference_seconds", float, default=30.0)
        )

    def _call(self, request) -> DiTCall:
        arrays = {name: optional_input(pb_utils, request, name) for name in INPUT_NAMES}
        inputs = parse_dit_token2wav_inputs(arrays, self.limits)
        if inputs.finalize is None:
            return DiTCall(inputs)
        single_instance_stream(self.instances, "finalize")
        stream_id = request.request_id()
        if not stream_id:
            raise RequestError("finalize", "needs a request id: a stream's calls are matched by it")
        first = stream_id not in self.model.open_streams and not inputs.finalize
        return DiTCall(inputs, stream_id, first)

    def execute(self, requests):
        """The requests of this batch share batched flow calls; streams' first chunks go first."""
        return self.calls.execute(requests)

    def finalize(self):
        self.calls.close()
        release_metrics(self.calls.stages, self.open_streams)
        end_stub_process()
