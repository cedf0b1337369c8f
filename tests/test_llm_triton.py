"""Our engine behind the tensorrt_llm contract on the real tritonserver (CPU)."""

import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from spark_models import LLM_SLOTS, build_spark_models
from triton_stats import inference_count, inference_count_at_least
from triton_stream import Stream, make_inputs
from tritonclient.utils import np_to_triton_dtype

from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import SamplingParams
from tritontts.spark import tokens
from tritontts.triton.llm_contract import SamplingParams as RequestParams
from tritontts.triton.llm_contract import generated_tokens, llm_request_inputs

TRITON_MODELS = [build_spark_models]
OUTPUTS = ["output_ids", "sequence_length"]
END_ID = 151645


@pytest.fixture(scope="module")
def server(triton):
    return triton.load("tensorrt_llm", "tensorrt_llm_offline", "tensorrt_llm_every3")


@pytest.fixture(scope="module")
def engine(spark_tiny_dir):
    return LLMEngine.from_pretrained(  # the output window of the served LLM (spark_models, run.sh's auto)
        spark_tiny_dir / "LLM",
        device="cpu",
        max_batch_size=4,
        cuda_graphs=False,
        output_tokens_from=tokens.OUTPUT_WINDOW_FROM,
    )


def prompt(n: int, offset: int = 0) -> np.ndarray:
    return (np.arange(n) * 37 + offset) % 150000 + 100


def request(
    ids: np.ndarray, max_tokens: int, seed: int, streaming: bool = True, min_tokens: int = 0
) -> dict[str, np.ndarray]:
    params = RequestParams(
        max_tokens=max_tokens, min_tokens=min_tokens, temperature=0.8, top_k=50, top_p=0.95, seed=seed
    )
    return llm_request_inputs(ids, END_ID, 151643, params, streaming)


def expected(
    engine: LLMEngine, ids: np.ndarray, max_tokens: int, seed: int, min_tokens: int = 0
) -> list[int]:
    params = SamplingParams(
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        temperature=0.8,
        top_k=50,
        top_p=0.95,
        seed=seed,
        end_id=END_ID,
    )
    return engine.generate([ids.tolist()], params)[0]


def tokens_of(result) -> list[int]:
    return [
        t
        for out in result.outputs
        for t in generated_tokens(out["output_ids"], out["sequence_length"]).tolist()
    ]


def test_concurrent_streams_of_different_lengths_one_cancelled(server, engine):
    specs = [(12, 40, 1), (30, 25, 2), (7, 60, 3), (50, 35, 4)]
    cancelled = Stream(server.grpc_url, "tensorrt_llm", request(prompt(20, 5), 200, 5), OUTPUTS)
    streams = [
        Stream(server.grpc_url, "tensorrt_llm", request(prompt(n, s), m, s), OUTPUTS) for n, m, s in specs
    ]
    partial = cancelled.read(limit=3)
    cancelled.cancel()
    results = [s.read() for s in streams]
    for (n, m, s), result in zip(specs, results):
        assert result.error is None
        assert len(result.outputs) >= 2, "tokens must arrive as they are generated"
        assert tokens_of(result) == expected(engine, prompt(n, s), m, s)
    assert 1 <= len(tokens_of(partial)) < 200


def test_a_fixed_stream_interval_sends_three_tokens_per_response(server, engine):
    """`stream_interval` 3: every response but the last carries three tokens, and together they are the
    tokens one response per token would have carried."""
    ids, length, seed = prompt(11, 8), 31, 8
    result = Stream(server.grpc_url, "tensorrt_llm_every3", request(ids, length, seed), OUTPUTS).read()
    sizes = [len(generated_tokens(out["output_ids"], out["sequence_length"])) for out in result.outputs]
    assert result.error is None
    assert tokens_of(result) == expected(engine, ids, length, seed)
    assert sizes[:-1] == [3] * (len(sizes) - 1) and 1 <= sizes[-1] <= 3, sizes


LONG = 900


def test_a_cancelled_request_frees_its_slot_at_once(server, engine):
    long = [  # min_tokens: no long request may end early and free its slot for the late one; 900 tokens: they
        # outlast the cancellation's way through Triton, the late request's prefill and its 20 tokens on a busy host
        Stream(server.grpc_url, "tensorrt_llm", request(prompt(10, s), LONG, s, min_tokens=LONG), OUTPUTS)
        for s in (21, 22, 23)
    ]
    cancelled = Stream(server.grpc_url, "tensorrt_llm", request(prompt(10, 24), 150, 24), OUTPUTS)
    assert len(long) + 1 == LLM_SLOTS
    cancelled.read(limit=2)
    for stream in long:
        stream.read(limit=2)  # all four slots are busy now
    cancelled.cancel()
    late = Stream(server.grpc_url, "tensorrt_llm", request(prompt(9, 77), 20, 77), OUTPUTS).read()
    results = [stream.read() for stream in long]
    assert tokens_of(late) == expected(engine, prompt(9, 77), 20, 77)
    # Only the cancelled request's slot could have taken the late one while the long ones ran.
    assert late.times[-1] < min(result.times[-1] for result in results)
    for s, result in zip((21, 22, 23), results):
        assert tokens_of(result) == expected(engine, prompt(10, s), LONG, s, min_tokens=LONG)


def test_offline_model_returns_all_tokens_at_once(server, engine):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    arrays = request(prompt(15, 3), 20, 11, streaming=False)
    result = client.infer("tensorrt_llm_offline", make_inputs(arrays))
    tokens = generated_tokens(result.as_numpy("output_ids"), result.as_numpy("sequence_length")).tolist()
    assert tokens == expected(engine, prompt(15, 3), 20, 11)


def http_infer(url: str, model: str, arrays: dict[str, np.ndarray]) -> list[int]:
    client = httpclient.InferenceServerClient(url, network_timeout=600.0)
    inputs = []
    for name, value in arrays.items():
        tensor = httpclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    result = client.infer(model, inputs)
    return generated_tokens(result.as_numpy("output_ids"), result.as_numpy("sequence_length")).tolist()


def grpc_infer(url: str, model: str, arrays: dict[str, np.ndarray]) -> list[int]:
    result = grpcclient.InferenceServerClient(url).infer(model, make_inputs(arrays))
    return generated_tokens(result.as_numpy("output_ids"), result.as_numpy("sequence_length")).tolist()


def test_offline_requests_join_a_running_generation_and_finish_first(server, engine):
    """In-flight batching without decoupling: short requests sent while a long one decodes are answered
    before it (the long one over HTTP, the short ones over gRPC, all one response each)."""
    long_ids, long_len = prompt(12, 9), 600
    shorts = [(prompt(6 + i, 40 + i), 8, 40 + i) for i in range(3)]
    finished, results, lock = [], {}, threading.Lock()

    def call(name, infer, url, arrays):
        tokens = infer(url, "tensorrt_llm_offline", arrays)
        with lock:
            finished.append(name)
            results[name] = tokens

    threads = [
        threading.Thread(
            target=call,
            args=("long", http_infer, server.http_url, request(long_ids, long_len, 9, False, long_len)),
        )
    ]
    threads += [
        threading.Thread(target=call, args=(i, grpc_infer, server.grpc_url, request(ids, m, s, False)))
        for i, (ids, m, s) in enumerate(shorts)
    ]
    before = inference_count(server, "tensorrt_llm_offline")
    threads[0].start()
    # The short ones leave once the long one is on the server: its execute has returned (the old execute,
    # which returned with the whole batch's tokens, made this wait last until the long one had finished).
    inference_count_at_least(server, "tensorrt_llm_offline", before + 1, timeout=60)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join()
    assert finished[-1] == "long", finished
    assert results["long"] == expected(engine, long_ids, long_len, 9, long_len)
    for i, (ids, m, s) in enumerate(shorts):
        assert results[i] == expected(engine, ids, m, s)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(input_ids=np.full((1, 5), 200000, np.int32)), "input_ids"),
        (dict(input_lengths=np.array([[0]], np.int32)), "input_lengths"),
        (dict(runtime_top_p=np.array([[1.5]], np.float32)), "top_p"),
        (dict(request_output_len=np.array([[0]], np.int32)), "max_tokens"),
    ],
)
def test_bad_requests_get_an_error_and_the_model_keeps_serving(server, engine, change, field):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    arrays = {**request(prompt(5), 5, 1, streaming=False), **change}
    with pytest.raises(Exception, match=field):
        client.infer("tensorrt_llm_offline", make_inputs(arrays))
    good = client.infer("tensorrt_llm_offline", make_inputs(request(prompt(5), 5, 1, streaming=False)))
    assert good.as_numpy("sequence_length").reshape(-1)[0] == 5
