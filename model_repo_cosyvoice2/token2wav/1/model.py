"""CosyVoice2 token2wav (flow + HiFT), wire-compatible with upstream's `token2wav` model.

Without prompt inputs, speaker "001" of spk2info.pt. With `token_offset`/`finalize`, one call of a stream keyed
by the request id (its HiFT caches stay here until the finalize call), else one whole utterance. On a GPU
each instance runs two streams of the default speaker before it serves (kernels loaded, HiFT graphs captured).
"""

import json

import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import Token2Wav, Token2WavCall
from tritontts.cosyvoice2.warmup import warm_up_streams
from tritontts.cosyvoice2.wire import TOKEN2WAV_INPUTS, Token2WavInputs, parse_token2wav_inputs
from tritontts.stream_states import DEFAULT_IDLE_TIMEOUT_S
from tritontts.triton.batched_flow import flow_placement, voice_prefix_bytes
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.first_chunk_priority import first_chunk_holder
from tritontts.triton.metrics import (
    OpenStreamsGauge,
    VoicePrefixGauges,
    release_metrics,
    token2wav_stage_seconds,
)
from tritontts.triton.params import model_param, optional_input, single_instance_stream, stream_instances
from tritontts.triton.stubs import end_stub_process
from tritontts.triton.token2wav_calls import Token2WavCalls, first_chunks_first, group_max


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        model_dir = model_param(config, "model_dir")
        device, dtype, graphs = flow_placement(config, args)
        self.model = Token2Wav.from_model_dir(
            model_dir,
            device=device,
            dtype=dtype,
            flow_graphs=graphs,
            stream_idle_timeout_s=model_param(config, "stream_idle_timeout_s", float, DEFAULT_IDLE_TIMEOUT_S),
            voice_prefix_bytes=voice_prefix_bytes(config),
        )
        self.calls = Token2WavCalls(
            pb_utils,
            self._call,
            self.model.run_many,
            token2wav_stage_seconds(pb_utils, args),
            lambda call: call.first_of_stream,
            lambda audio: pb_utils.InferenceResponse(
                [pb_utils.Tensor("waveform", audio.float().cpu().numpy().reshape(1, -1))]
            ),
            first_chunk_holder(config, args, device),
            first_chunks_first(config),
            group_max(graphs),
            device,
        )
        self.open_streams = OpenStreamsGauge(pb_utils, args, lambda: self.model.open_streams)
        self.prefix_gauges = (
            VoicePrefixGauges(pb_utils, args, self.model.voice_prefixes) if self.model.voice_keys else None
        )
        self.instances = stream_instances(config)
        speakers = load_spk2info(f"{model_dir}/spk2info.pt")
        self.default = speakers.get(DEFAULT_SPEAKER) or next(iter(speakers.values()))
        if device.type == "cuda":
            warm_up_streams(self.model.run_many, self._warm_up_call, self.model.close)

    def _warm_up_call(self, target, chunk, stream_id) -> Token2WavCall:
        prompt = (self.default.speech_token, self.default.speech_feat, self.default.embedding)
        return Token2WavCall(target, *prompt, stream_id, chunk.token_offset, chunk.finalize)

    def _call(self, request) -> Token2WavCall:
        arrays = {name: optional_input(pb_utils, request, name) for name in TOKEN2WAV_INPUTS}
        inputs: Token2WavInputs = parse_token2wav_inputs(arrays, self.default)
        prompt = (inputs.target, inputs.prompt_tokens, inputs.prompt_feat, inputs.embedding)
        if inputs.token_offset is None:
            return Token2WavCall(*prompt)
        single_instance_stream(self.instances, "token_offset")
        stream_id = request.request_id()
        if not stream_id:
            raise ValueError("token_offset needs a request id: a stream's calls are matched by it")
        return Token2WavCall(*prompt, stream_id, inputs.token_offset, inputs.finalize)

    def execute(self, requests):
        """The requests of this batch share batched flow decoder calls; streams' first chunks go first."""
        return self.calls.execute(requests)

    def finalize(self):
        self.calls.close()
        release_metrics(
            self.calls.stages, self.open_streams, *([self.prefix_gauges] if self.prefix_gauges else [])
        )
        end_stub_process()
