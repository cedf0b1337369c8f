"""The tensors our BLS models exchange with the `tensorrt_llm` model, whichever backend serves it.

Names, dtypes and shapes follow tensorrtllm_backend's `tensorrt_llm` model: every input carries a leading
batch dimension of 1 per request, `output_ids` is [batch, beam, tokens] and `sequence_length` [batch, beam].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

OUTPUT_NAMES = ("output_ids", "sequence_length")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 1024
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    seed: int | None = None


def bad_words_list(token_ids: Sequence[int]) -> np.ndarray:
    """TensorRT-LLM's `bad_words_list` [1, 2, N] of single-token words: the ids, then end offsets 1..N."""
    ids = np.asarray(token_ids, dtype=np.int32).reshape(-1)
    return np.stack([ids, np.arange(1, ids.size + 1, dtype=np.int32)])[None]


def llm_request_inputs(
    input_ids: np.ndarray,
    end_id: int,
    pad_id: int,
    params: SamplingParams,
    streaming: bool,
    bad_ids: Sequence[int] = (),
) -> dict[str, np.ndarray]:
    """The input tensors of one generation request (`bad_ids`: token ids never to generate)."""
    ids = np.asarray(input_ids, dtype=np.int32).reshape(1, -1)
    inputs = {
        "input_ids": ids,
        "input_lengths": np.array([[ids.shape[1]]], dtype=np.int32),
        "request_output_len": np.array([[params.max_tokens]], dtype=np.int32),
        "end_id": np.array([[end_id]], dtype=np.int32),
        "pad_id": np.array([[pad_id]], dtype=np.int32),
        "streaming": np.array([[streaming]], dtype=np.bool_),
        "temperature": np.array([[params.temperature]], dtype=np.float32),
        "runtime_top_k": np.array([[params.top_k]], dtype=np.int32),
        "runtime_top_p": np.array([[params.top_p]], dtype=np.float32),
        "repetition_penalty": np.array([[params.repetition_penalty]], dtype=np.float32),
        "min_length": np.array([[params.min_tokens]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]], dtype=np.bool_),
    }
    if bad_ids:
        inputs["bad_words_list"] = bad_words_list(bad_ids)
    if params.seed is not None:
        inputs["random_seed"] = np.array([[params.seed]], dtype=np.uint64)
    return inputs


def generated_tokens(output_ids: np.ndarray, sequence_length: np.ndarray) -> np.ndarray:
    """The tokens of the first beam of the first (only) sequence of one response."""
    output_ids = np.asarray(output_ids).reshape(1, 1, -1)
    length = int(np.asarray(sequence_length).reshape(-1)[0])
    return output_ids[0, 0, :length].astype(np.int64)
