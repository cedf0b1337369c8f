"""What a BLS gets back from a model call owns its memory: the response's tensors are views of the stub's
shared-memory pool, and a kept view (a cached voice) would hold the pool's block."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tritontts.triton.bls import ModelCallError, _outputs


class PoolTensor:
    def __init__(self, pool: np.ndarray):
        self.pool = pool

    def is_cpu(self) -> bool:
        return True

    def as_numpy(self) -> np.ndarray:
        return self.pool[:4]  # a view, as the stub's tensors are


def fake_pb_utils(tensors: dict):
    return SimpleNamespace(get_output_tensor_by_name=lambda response, name: tensors.get(name))


def response(error: str | None = None):
    return SimpleNamespace(
        has_error=lambda: error is not None, error=lambda: SimpleNamespace(message=lambda: error)
    )


def test_outputs_are_copies_of_the_response_memory():
    pool = np.arange(16, dtype=np.float32)
    out = _outputs(
        fake_pb_utils({"embedding": PoolTensor(pool)}), "speaker_embedding", response(), ["embedding"]
    )
    assert np.array_equal(out["embedding"], pool[:4])
    assert out["embedding"].base is None and not np.shares_memory(out["embedding"], pool)
    pool[:] = -1  # the pool's block reused by another response
    assert out["embedding"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_missing_output_or_an_error_names_the_model():
    with pytest.raises(ModelCallError, match="speaker_embedding returned no 'embedding'"):
        _outputs(fake_pb_utils({}), "speaker_embedding", response(), ["embedding"])
    with pytest.raises(ModelCallError, match="audio_tokenizer: bad wav"):
        _outputs(fake_pb_utils({}), "audio_tokenizer", response("bad wav"), ["tokens"])
