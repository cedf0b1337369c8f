"""CosyVoice3 token2wav: speech tokens (+ prompt) → mel with the DiT flow, stateless, as upstream's.

The requests of one Triton batch are decoded together (`Token2Mel.run_many`). The work is in
tritontts.cosyvoice3.token2mel and tritontts.cosyvoice3.wire. On a GPU each instance runs two streams of the
default speaker before it serves."""

import json

import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice2.warmup import warm_up_streams
from tritontts.cosyvoice2.wire import TOKEN2WAV_INPUTS
from tritontts.cosyvoice3.token2mel import Token2Mel
from tritontts.cosyvoice3.wire import Token2MelCall, parse_token2mel_inputs
from tritontts.triton.batched_flow import flow_placement
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.first_chunk_priority import first_chunk_holder
from tritontts.triton.metrics import release_metrics, token2wav_stage_seconds
from tritontts.triton.params import model_param, optional_input
from tritontts.triton.stubs import end_stub_process
from tritontts.triton.token2wav_calls import Token2WavCalls, first_chunks_first, group_max


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        device, dtype, graphs = flow_placement(config, args)
        self.model = Token2Mel.from_model_dir(model_param(config, "model_dir"), device, dtype, graphs)
        self.calls = Token2WavCalls(
            pb_utils,
            self._call,
            self.model.run_many,
            token2wav_stage_seconds(pb_utils, args),
            lambda call: call.token_offset == 0,
            lambda mel: pb_utils.InferenceResponse([pb_utils.Tensor("mel", mel.cpu().numpy()[None])]),
            first_chunk_holder(config, args, device),
            first_chunks_first(config),
            group_max(graphs),
            device,
        )
        if device.type == "cuda" and self.model.default is not None:
            warm_up_streams(self.model.run_many, self._warm_up_call)

    def _warm_up_call(self, target, chunk, stream_id) -> Token2MelCall:
        voice = self.model.default
        prompt = (voice.speech_token, voice.speech_feat, voice.embedding)
        return Token2MelCall(target, *prompt, chunk.token_offset, chunk.finalize)

    def _call(self, request) -> Token2MelCall:
        arrays = {name: optional_input(pb_utils, request, name) for name in TOKEN2WAV_INPUTS}
        return parse_token2mel_inputs(arrays, self.model.default)

    def execute(self, requests):
        return self.calls.execute(requests)

    def finalize(self):
        self.calls.close()
        release_metrics(self.calls.stages)
        end_stub_process()
