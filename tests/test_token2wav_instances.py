"""Several token2wav instances (run.sh --token2wav_instance_num) on the real tritonserver, with the tiny synthetic
CosyVoice2 token2wav: two instances give each offline call the audio one instance gives; behind the dynamic
batcher they refuse stream calls (a stream's state lives in the instance that served its first call); behind an
Oldest sequence batcher (what run.sh makes for streaming) every stream stays on one instance, so concurrent
streams get the audio one instance gives them, and the BLS marks its calls so it can stream through them."""

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
    bls_values,
    build_cosyvoice2_models,
    checkpoint_paths,
    install_template,
)
from cosyvoice_triton import reference_request
from triton_stream import make_inputs, stream_waveforms
from tritonclient.utils import InferenceServerException
from waiting import wait_until

from tritontts.bench.server_stages import TOKEN2WAV_COUNT, scrape
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice2.wire import token2wav_arrays
from tritontts.triton.sequence import use_sequence_batching

ONE, TWO, ROUTED = PREFIX + "token2wav", PREFIX + "token2wav_two", PREFIX + "token2wav_routed"
BLS = PREFIX + "routed"
LEAVES = [PREFIX + m for m in ("audio_tokenizer", "speaker_embedding", "tensorrt_llm")]


def build_two_instance_token2wav(repo: Path, data: Path) -> None:
    paths = checkpoint_paths(data.parent / "build_cosyvoice2_models")
    model_dir = paths.model_dir.resolve()
    values = f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32,instance_num:2,cuda_graphs:auto,flow_compile:false,stream_calls:true"
    values += (
        ",cuda_graph_batch_sizes:1\\,2,first_chunk_priority:false,first_chunks_first:true,voice_prefix_gib:0"
    )
    install_template(TEMPLATES, "token2wav", repo, TWO, values)
    config = install_template(TEMPLATES, "token2wav", repo, ROUTED, values) / "config.pbtxt"
    config.write_text(use_sequence_batching(config.read_text(), max_candidates=4))
    bls = bls_values(model_dir, paths.llm_dir.resolve(), True, "tensorrt_llm", token2wav=ROUTED)
    install_template(TEMPLATES, "cosyvoice2", repo, BLS, bls)


TRITON_MODELS = [build_cosyvoice2_models, build_two_instance_token2wav]


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(ONE, TWO, ROUTED, *LEAVES, BLS)


def infer(server, model: str, values: dict, request_id: str = "", **sequence) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, make_inputs(values), request_id=request_id, **sequence)
        return result.as_numpy("waveform").reshape(-1)
    finally:
        client.close()


def stream_calls(server, model: str, ids: np.ndarray, stream: str, routed: bool) -> list[np.ndarray]:
    """One stream of token2wav calls on upstream's schedule, as the BLS makes them."""
    chunks = []
    for chunk in StreamSchedule().plan(ids.size):
        values = token2wav_arrays(
            ids[: chunk.token_end], token_offset=chunk.token_offset, finalize=chunk.finalize
        )
        sequence = {}
        if routed:
            start, end = chunk.token_offset == 0, chunk.finalize
            sequence = {"sequence_id": stream, "sequence_start": start, "sequence_end": end}
        chunks.append(infer(server, model, values, request_id=stream, **sequence))
    return chunks


def stubs_of(server, model: str) -> int:
    pattern = f"triton_python_backend_stub.* {model}_0_[0-9]+ "
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
        InferenceServerException,
        match="token_offset: stream calls need a model with one instance or a sequence batcher",
    ):
        infer(server, TWO, values, request_id="s1")
    assert infer(server, ONE, values, request_id="s1").size > 0


def executions_by_instance(server, model: str) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"
    return {
        dict(labels)["instance"]: value
        for (name, labels), value in scrape(url).items()
        if name == TOKEN2WAV_COUNT and dict(labels).get("model") == model
    }


def test_a_sequence_batcher_keeps_each_of_four_concurrent_streams_on_one_instance(server):
    assert stubs_of(server, ROUTED) == 2
    # 35 to 50 tokens: 3 or 4 calls a stream (start, middle, finalize) on 15-token hops
    calls = [np.random.default_rng(10 + i).integers(0, 6561, 35 + 5 * i).astype(np.int32) for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        routed = list(
            pool.map(lambda i: stream_calls(server, ROUTED, calls[i], f"routed-{i}", True), range(4))
        )
    for i, ids in enumerate(calls):
        alone = stream_calls(server, ONE, ids, f"alone-{i}", False)
        assert [c.size for c in routed[i]] == [c.size for c in alone]
        np.testing.assert_allclose(np.concatenate(routed[i]), np.concatenate(alone), atol=1e-6)
    # both instances served streams (and each stream only one, or its audio would differ above)
    instances = [f"{ROUTED}_0_0", f"{ROUTED}_0_1"]
    served = wait_until(
        lambda: executions_by_instance(server, ROUTED),
        lambda executions: set(instances) <= set(executions),
        f"executions of both instances of {ROUTED} on /metrics",
    )
    assert sorted(served) == instances


def test_the_bls_streams_through_routed_instances(server, prompt_zh):
    from tritontts.audio import load_wav

    wav = load_wav(prompt_zh, 16000)[: 16000 * 3]
    values = reference_request(wav, "身临其境，换新体验。", "吃燕窝就选燕之屋")
    parameters = {"min_new_tokens": 60, "max_new_tokens": 60}
    with ThreadPoolExecutor(3) as pool:
        streams = list(
            pool.map(lambda _: stream_waveforms(server.grpc_url, BLS, values, parameters), range(3))
        )
    for chunks in streams:
        assert [c.size for c in chunks] == [(30 - 8) * 480, 50 * 480, (2 * 20 + 8) * 480]
