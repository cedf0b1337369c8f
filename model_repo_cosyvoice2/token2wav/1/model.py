"""CosyVoice2 token2wav (flow + HiFT), wire-compatible with upstream's `token2wav` model.

Without prompt inputs, speaker "001" of spk2info.pt. With `token_offset`/`finalize`, one call of a stream keyed
by the request id (its HiFT caches stay here until the finalize call), else one whole utterance.
"""

import json

import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import Token2Wav, Token2WavCall
from tritontts.cosyvoice2.wire import Token2WavInputs, parse_token2wav_inputs
from tritontts.cuda_graphs import flow_graph_config
from tritontts.devices import resolve_device, resolve_flow_dtype
from tritontts.stage_timer import StageTimer
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.metrics import token2wav_stage_seconds
from tritontts.triton.params import (
    error_response,
    model_param,
    optional_input,
    single_instance_stream,
    stream_instances,
)

INPUT_NAMES = (
    "target_speech_tokens",
    "prompt_speech_tokens",
    "prompt_speech_feat",
    "prompt_spk_embedding",
    "token_offset",
    "finalize",
)


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        model_dir = model_param(config, "model_dir")
        device = resolve_device(model_param(config, "device", default="auto"))
        dtype = resolve_flow_dtype(model_param(config, "dtype", default="auto"), device)
        graphs = flow_graph_config(
            model_param(config, "cuda_graphs", default="auto"),
            model_param(config, "cuda_graph_batch_sizes", default="1,2,4,8"),
            device,
        )
        self.model = Token2Wav.from_model_dir(model_dir, device=device, dtype=dtype, flow_graphs=graphs)
        self.stages = token2wav_stage_seconds(pb_utils, args)
        self.instances = stream_instances(config)
        speakers = load_spk2info(f"{model_dir}/spk2info.pt")
        self.default = speakers.get(DEFAULT_SPEAKER) or next(iter(speakers.values()))

    def _call(self, request) -> Token2WavCall:
        arrays = {name: optional_input(pb_utils, request, name) for name in INPUT_NAMES}
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
        """Every request of this batch in one `run_many`: their flow decoders share batched calls."""
        outcomes: list = [None] * len(requests)
        calls, slots = [], []
        for i, request in enumerate(requests):
            try:
                calls.append(self._call(request))
                slots.append(i)
            except Exception as err:
                outcomes[i] = err
        timer = StageTimer()
        for slot, result in zip(slots, self.model.run_many(calls, timer)):
            outcomes[slot] = result
        if calls:
            first = all(call.first_of_stream for call in calls)
            self.stages.add(timer.stages, chunk="first" if first else "other")
        responses = []
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                responses.append(error_response(pb_utils, outcome))
                continue
            audio = outcome.float().cpu().numpy().reshape(1, -1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)]))
        return responses
