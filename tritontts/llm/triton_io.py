"""Reading a `tensorrt_llm`-contract request into engine terms, and writing the response tensors back."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tritontts.llm.sequence import SamplingParams
from tritontts.triton.params import RequestError

GetInput = Callable[[str], "np.ndarray | None"]


@dataclass(frozen=True)
class LLMRequest:
    prompt_ids: list[int]
    params: SamplingParams
    streaming: bool
    exclude_input: bool


def _scalar(get: GetInput, name: str, kind: type, default=None):
    array = get(name)
    if array is None:
        if default is None:
            raise RequestError(name, "is required")
        return default
    if array.size != 1:
        raise RequestError(name, f"must hold one value per request, got shape {list(array.shape)}")
    return kind(array.reshape(-1)[0])


def parse_bad_words(array: np.ndarray | None, vocab_size: int) -> tuple[int, ...]:
    """TensorRT-LLM's `bad_words_list` ([1, 2, N] or [2, N]: the words' ids back to back, then each word's end
    offset, -1 after the last) as token ids; only single-token words are supported."""
    if array is None:
        return ()
    if array.ndim == 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 2 or array.shape[0] != 2:
        raise RequestError("bad_words_list", f"must be [1, 2, N] or [2, N], got shape {list(array.shape)}")
    ids, offsets = array.astype(np.int64)
    padding = offsets < 0
    count = int(np.argmax(padding)) if padding.any() else offsets.size
    if not padding[count:].all():
        raise RequestError("bad_words_list", "offsets must end with -1 padding only")
    ends = offsets[:count]
    if not np.array_equal(ends, np.arange(1, count + 1)):
        raise RequestError(
            "bad_words_list", f"only single-token words are supported, got word end offsets {ends.tolist()}"
        )
    words = ids[:count]
    if words.size and (words.min() < 0 or words.max() >= vocab_size):
        raise RequestError("bad_words_list", f"ids must be in [0, {vocab_size})")
    return tuple(int(t) for t in words)


def parse_llm_request(get: GetInput, vocab_size: int, default_streaming: bool) -> LLMRequest:
    ids = get("input_ids")
    if ids is None:
        raise RequestError("input_ids", "is required")
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise RequestError("input_ids", f"must be [1, tokens] per request, got shape {list(ids.shape)}")
    length = _scalar(get, "input_lengths", int, default=ids.shape[1])
    if not 0 < length <= ids.shape[1]:
        raise RequestError("input_lengths", f"must be in 1..{ids.shape[1]}, got {length}")
    prompt = ids[0, :length].astype(np.int64)
    if prompt.min() < 0 or prompt.max() >= vocab_size:
        raise RequestError("input_ids", f"ids must be in [0, {vocab_size})")
    if _scalar(get, "beam_width", int, default=1) != 1:
        raise RequestError("beam_width", "only 1 is supported by the torch engine")
    seed = _scalar(get, "random_seed", int, default=-1)
    try:
        params = SamplingParams(
            max_tokens=_scalar(get, "request_output_len", int),
            min_tokens=_scalar(get, "min_length", int, default=0),
            temperature=_scalar(get, "temperature", float, default=1.0),
            top_k=_scalar(get, "runtime_top_k", int, default=0),
            top_p=_scalar(get, "runtime_top_p", float, default=1.0),
            repetition_penalty=_scalar(get, "repetition_penalty", float, default=1.0),
            seed=seed if seed >= 0 else None,
            end_id=_scalar(get, "end_id", int, default=-1),
            pad_id=_scalar(get, "pad_id", int, default=-1),
            bad_token_ids=parse_bad_words(get("bad_words_list"), vocab_size),
        )
    except ValueError as err:
        raise RequestError("sampling", str(err)) from err
    return LLMRequest(
        prompt_ids=prompt.tolist(),
        params=params,
        streaming=bool(_scalar(get, "streaming", bool, default=default_streaming)),
        exclude_input=bool(_scalar(get, "exclude_input_in_output", bool, default=True)),
    )


def response_arrays(tokens: list[int]) -> dict[str, np.ndarray]:
    """`output_ids` [1, 1, n] and `sequence_length` [1, 1] for one response."""
    ids = np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1)
    return {"output_ids": ids, "sequence_length": np.array([[ids.shape[2]]], dtype=np.int32)}
