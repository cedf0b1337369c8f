"""CosyVoice3 token2wav: speech tokens (+ prompt) → mel with the DiT flow, stateless, as upstream's.

The requests of one Triton batch are decoded together (`Token2Mel.run_many`). The work is in
tritontts.cosyvoice3.token2mel and tritontts.cosyvoice3.wire."""

import json

import triton_python_backend_utils as pb_utils

from tritontts.cosyvoice3.token2mel import Token2Mel
from tritontts.cosyvoice3.wire import parse_token2mel_inputs
from tritontts.cuda_graphs import flow_graph_config
from tritontts.devices import resolve_device, resolve_flow_dtype
from tritontts.stage_timer import StageTimer
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.metrics import token2wav_stage_seconds
from tritontts.triton.params import error_response, model_param, optional_input

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
        device = resolve_device(model_param(config, "device", default="auto"))
        dtype = resolve_flow_dtype(model_param(config, "dtype", default="auto"), device)
        graphs = flow_graph_config(
            model_param(config, "cuda_graphs", default="auto"),
            model_param(config, "cuda_graph_batch_sizes", default="1,2,4,8"),
            device,
        )
        self.model = Token2Mel.from_model_dir(model_param(config, "model_dir"), device, dtype, graphs)
        self.stages = token2wav_stage_seconds(pb_utils, args)

    def execute(self, requests):
        outcomes: list = [None] * len(requests)
        calls, slots = [], []
        for i, request in enumerate(requests):
            try:
                arrays = {name: optional_input(pb_utils, request, name) for name in INPUT_NAMES}
                calls.append(parse_token2mel_inputs(arrays, self.model.default))
                slots.append(i)
            except Exception as err:
                outcomes[i] = err
        timer = StageTimer()
        for slot, mel in zip(slots, self.model.run_many(calls, timer)):
            outcomes[slot] = mel
        if calls:
            first = all(call.token_offset in (None, 0) for call in calls)
            self.stages.add(timer.stages, chunk="first" if first else "other")
        responses = []
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                responses.append(error_response(pb_utils, outcome))
                continue
            mel = outcome.cpu().numpy()[None]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("mel", mel)]))
        return responses
