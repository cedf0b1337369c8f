"""Several token2wav instances (run.sh --token2wav_instance_num, offline deployments): on the real tritonserver,
two instances of the tiny synthetic CosyVoice2 token2wav give each offline call the audio one instance gives, and
refuse stream calls, whose state lives in the one instance that served their first call."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cosyvoice2_models import (
    COMMON,
    PREFIX,
    TEMPLATES,
    build_cosyvoice2_models,
    checkpoint_paths,
    install_template,
)
from triton_stream import make_inputs
from tritonclient.utils import InferenceServerException

from tritontts.cosyvoice2.wire import token2wav_arrays

ONE, TWO = PREFIX + "token2wav", PREFIX + "token2wav_two"


def build_two_instance_token2wav(repo: Path, data: Path) -> None:
    model_dir = checkpoint_paths(data.parent / "build_cosyvoice2_models").model_dir.resolve()
    values = f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32,instance_num:2,cuda_graphs:auto"
    install_template(TEMPLATES, "token2wav", repo, TWO, values + ",cuda_graph_batch_sizes:1\\,2")


TRITON_MODELS = [build_cosyvoice2_models, build_two_instance_token2wav]


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(ONE, TWO)


def infer(server, model: str, values: dict, request_id: str = "") -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return (
            client.infer(model, make_inputs(values), request_id=request_id).as_numpy("waveform").reshape(-1)
        )
    finally:
        client.close()


def stubs_of(server, model: str) -> int:
    pattern = f"triton_python_backend_stub.*{model}_0_"
    found = subprocess.run(
        ["pgrep", "-s", str(server.server.process.pid), "-f", pattern], capture_output=True
    )
    return len(found.stdout.split())


def test_two_instances_run_and_give_each_offline_call_the_one_instance_audio(server):
    assert (stubs_of(server, ONE), stubs_of(server, TWO)) == (1, 2)
    calls = [
        np.random.default_rng(seed).integers(0, 6561, 20 + 5 * seed).astype(np.int32) for seed in range(6)
    ]
    with ThreadPoolExecutor(6) as pool:
        two = list(pool.map(lambda ids: infer(server, TWO, token2wav_arrays(ids)), calls))
    for ids, audio in zip(calls, two):
        np.testing.assert_allclose(audio, infer(server, ONE, token2wav_arrays(ids)), atol=1e-6)
        assert audio.size == ids.size * 960


def test_two_instances_refuse_a_stream_call_naming_token_offset(server):
    values = token2wav_arrays(np.arange(20, dtype=np.int32), token_offset=0, finalize=True)
    with pytest.raises(
        InferenceServerException, match="token_offset: stream calls need a model with one instance"
    ):
        infer(server, TWO, values, request_id="s1")
    assert infer(server, ONE, values, request_id="s1").size > 0
