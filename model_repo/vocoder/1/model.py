"""BiCodec vocoder: the requests of one execute are turned into audio in a few padded passes, each request's audio
as it would be alone; on CUDA the passes replay from CUDA graphs (parameter `cuda_graphs`: auto | true | false),
the shorter ones captured at load; parameter `compile` (false | auto = where there are graphs | true) makes them
passes of BiCodec compiled by torch.compile. With `first_chunk_priority`, an execute holding a stream's first chunk
(`first_chunk`) holds the LLM on this GPU (tritontts.triton.first_chunk_priority)."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

from tritontts.cuda_graphs import compile_wanted, graphs_wanted
from tritontts.spark.codec import SparkCodec
from tritontts.triton.debug import enable_stack_dumps
from tritontts.triton.first_chunk_priority import first_chunk_holder, holding
from tritontts.triton.instance_device import instance_device
from tritontts.triton.params import RequestError, error_response, model_param, optional_input, required_input
from tritontts.triton.stubs import end_stub_process

GLOBAL_CODEBOOK, SEMANTIC_CODEBOOK = 4096, 8192


def _token_row(request, name, codebook):
    tokens = required_input(pb_utils, request, name, dtype=np.int32, ndim=2)
    if tokens.shape[0] != 1 or tokens.shape[1] == 0:
        raise RequestError(name, f"must be one non-empty row of tokens, got shape {list(tokens.shape)}")
    if tokens.min() < 0 or tokens.max() >= codebook:
        raise RequestError(name, f"ids must be in [0, {codebook}), got [{tokens.min()}, {tokens.max()}]")
    return tokens[0]


def _first_chunk(request) -> bool:
    flag = optional_input(pb_utils, request, "first_chunk")
    return flag is not None and bool(flag.any())


class TritonPythonModel:
    def initialize(self, args):
        enable_stack_dumps()
        config = json.loads(args["model_config"])
        device = instance_device(args, model_param(config, "device", default="auto"))
        graphs = graphs_wanted(model_param(config, "cuda_graphs", default="auto"), device)
        self.codec = SparkCodec(
            model_param(config, "model_dir"),
            device,
            with_tokenizer=False,
            cuda_graphs=graphs,
            compile_vocoder=compile_wanted(model_param(config, "compile", default="false"), graphs),
        )
        self.holder = first_chunk_holder(config, args, device)
        captured = self.codec.detokenizer.warm()
        if captured:
            pb_utils.Logger.log_info(f"vocoder: {captured} padded passes captured in CUDA graphs")

    def execute(self, requests):
        responses, globals_, semantics, slots = [None] * len(requests), [], [], []
        first_chunk = False
        for i, request in enumerate(requests):
            try:
                g = _token_row(request, "global_tokens", GLOBAL_CODEBOOK)
                s = _token_row(request, "semantic_tokens", SEMANTIC_CODEBOOK)
                if g.size != 32:
                    raise RequestError("global_tokens", f"must hold 32 tokens, got {g.size}")
                globals_.append(g)
                semantics.append(s)
                slots.append(i)
                first_chunk = first_chunk or _first_chunk(request)
            except Exception as err:
                responses[i] = error_response(pb_utils, err)
        try:
            with holding(self.holder, first_chunk):
                audios = self.codec.detokenize(globals_, semantics) if slots else []
        except Exception as err:
            audios = [err] * len(slots)
        for i, audio in zip(slots, audios):
            if isinstance(audio, Exception):
                responses[i] = error_response(pb_utils, audio)
            else:
                responses[i] = pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio.reshape(1, -1))])
        return responses

    def finalize(self):
        if self.holder is not None:
            self.holder.close()
        end_stub_process()
