"""Bistream through the session tritonserver (docs/streaming-text.md, "Bistream"): the `cosyvoice2` BLS with the
request parameter `bistream_session` speaks text pushed to the `text_inbox` model while the request runs.

The tiny synthetic CosyVoice2 (CPU, fp32): the BLS's speech tokens are not outputs, so the audio is checked
against an LLM-level `run_bistream` over gRPC to the offline `tensorrt_llm` model with the BLS's own sampling
(seeded, so each segment request samples the same tokens): 960 samples a speech token.
"""

from __future__ import annotations

import queue
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from cosyvoice2_models import MAX_NEW_TOKENS, PREFIX, TEXT_INBOX, build_cosyvoice2_models, checkpoint_paths
from triton_stream import make_inputs
from waiting import scaled

from tritontts.cosyvoice2.bistream import BistreamTokens, run_bistream
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt, Decoding
from tritontts.triton.llm_contract import SamplingParams as ContractParams
from tritontts.triton.llm_contract import generated_tokens, llm_request_inputs

TRITON_MODELS = [build_cosyvoice2_models]
pytestmark = pytest.mark.slow
BLS = "cosyvoice2"
LLM = PREFIX + "tensorrt_llm_offline"
SAMPLES_PER_TOKEN = 960
DELTAS = [
    "身临其境，",
    "换新体验。",
    "塑料袋",
    "是个好",
    "东西，",
    "我们每天",
    "都在用。",
    "今天天气",
    "很好，",
    "出去走走吧！",
]
"""pieces as an LLM might write them; the first audio needs 18 speech tokens, two segments of 5 text tokens"""


@pytest.fixture(scope="module")
def server(triton):
    leaves = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm", "tensorrt_llm_offline")
    return triton.load(*(PREFIX + leaf for leaf in leaves), BLS, TEXT_INBOX)


@pytest.fixture
def client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def text_inputs(**values):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    inputs = []
    for name, value in values.items():
        array = np.array([value.encode()] if isinstance(value, str) else [value], dtype=None)
        array = array.astype(object) if isinstance(value, str) else array.astype(np.bool_)
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def push(client, session: str, text: str, final: bool = False) -> None:
    result = client.infer(TEXT_INBOX, text_inputs(session_id=session, text=text, final=final))
    assert result.as_numpy("accepted").tolist() == [True]


class Bistream:
    """One bistream request to the BLS over a gRPC stream; `responses` gets (waveform or None, error)."""

    def __init__(
        self, client, parameters: dict | None = None, target_text: str = "", model: str = BLS
    ) -> None:
        import tritonclient.grpc as grpcclient

        self.client, self.session = client, uuid.uuid4().hex
        self.responses: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: self.responses.put((result, error)))
        target = grpcclient.InferInput("target_text", [1, 1], "BYTES")
        target.set_data_from_numpy(np.array([[target_text.encode()]], dtype=object))
        params = {"bistream_session": self.session, "mode": "cross_lingual"} | (parameters or {})
        client.async_stream_infer(
            model, [target], request_id=self.session, parameters=params, enable_empty_final_response=True
        )

    def next(self, timeout: float = 300) -> np.ndarray:
        """The next response's audio; raises the stream's error."""
        result, error = self.responses.get(timeout=scaled(timeout))
        if error is not None:
            raise error
        return result.as_numpy("waveform").reshape(-1)

    def rest(self) -> list[np.ndarray]:
        """The audio of the responses to the final one."""
        chunks = []
        while True:
            result, error = self.responses.get(timeout=scaled(300))
            if error is not None:
                raise error
            if result.get_response().parameters["triton_final_response"].bool_param:
                if result.as_numpy("waveform") is not None:
                    chunks.append(result.as_numpy("waveform").reshape(-1))
                return chunks
            chunks.append(result.as_numpy("waveform").reshape(-1))


def expected_tokens(server, client, deltas: list[str]) -> list[int]:
    """The BLS's speech tokens by our schedule over gRPC segment requests with its sampling (cross_lingual)."""
    paths = checkpoint_paths(server.repo.parent / "data" / build_cosyvoice2_models.__name__)
    prompter = CosyVoice2Prompt.from_llm_dir(paths.llm_dir)
    return llm_level_tokens(client, LLM, prompter, BistreamTokens.cosyvoice2(), deltas, "", MAX_NEW_TOKENS)


def llm_level_tokens(
    client, llm: str, prompter, tokens: BistreamTokens, deltas: list[str], prompt_text: str, max_tokens: int
) -> list[int]:
    """`run_bistream`'s speech tokens over gRPC segment requests to the offline `llm` with a BLS's sampling
    (`prompter` tokenizes like that BLS; `prompt_text`: its mode's prompt text)."""
    decoding = Decoding(max_tokens=max_tokens)

    def run(ids: list[int], max_tokens: int, end_id: int, bad_ids: tuple[int, ...]) -> Iterator[int]:
        params = ContractParams(max_tokens, decoding.temperature, decoding.top_k, decoding.top_p,
                                decoding.repetition_penalty, 0, decoding.seed)  # fmt: skip
        arrays = llm_request_inputs(np.asarray(ids), end_id, end_id, params, False, bad_ids=bad_ids)
        result = client.infer(llm, make_inputs(arrays))
        yield from generated_tokens(
            result.as_numpy("output_ids"), result.as_numpy("sequence_length")
        ).tolist()

    deltas_ids = [prompter.text_ids(d) for d in deltas]
    prompt_ids = prompter.bistream_prompt_ids(prompt_text)
    return list(run_bistream(deltas_ids, run, tokens, prompt_ids, [], max_tokens))


def test_audio_comes_while_the_text_is_still_being_pushed(server, client):
    stream = Bistream(client)
    try:
        assert stream.next().size == 0  # the inbox exists: push from now on
        chunks: list[np.ndarray] = []
        for delta in DELTAS[:-1]:
            push(client, stream.session, delta)
            time.sleep(0.05)
        deadline = time.monotonic() + scaled(300)
        while not chunks and time.monotonic() < deadline:  # before the final push
            chunks.append(stream.next())
        assert chunks and chunks[0].size > 0
        push(client, stream.session, DELTAS[-1], final=True)
        chunks += stream.rest()
    finally:
        client.stop_stream()
    samples = np.concatenate(chunks)
    tokens = expected_tokens(server, client, DELTAS)
    assert 18 <= len(tokens) and samples.size == len(tokens) * SAMPLES_PER_TOKEN
    assert 0 < np.abs(samples).max() <= 1.0
    with pytest.raises(Exception, match="session_id"):  # the inbox is gone with the request
        push(client, stream.session, "more")


def test_the_same_text_pushed_differently_speaks_the_same(server, client):
    """Seeded sampling and one-delta-at-a-time tokenization: the same deltas give the same audio, the first one
    pushed or sent as target_text."""
    import tritonclient.grpc as grpcclient

    runs = []
    for pushes, first in ((DELTAS, ""), (DELTAS[1:], DELTAS[0])):
        one = grpcclient.InferenceServerClient(server.grpc_url)
        stream = Bistream(one, target_text=first)
        try:
            assert stream.next().size == 0
            for delta in pushes:
                push(one, stream.session, delta)
            push(one, stream.session, "", final=True)
            runs.append(np.concatenate(stream.rest()))
        finally:
            one.stop_stream()
            one.close()
    assert runs[0].size == runs[1].size > 0
    np.testing.assert_allclose(runs[0], runs[1], atol=1e-5)


def test_a_push_to_an_unknown_session_names_session_id_and_the_server_goes_on(server, client):
    from tritonclient.utils import InferenceServerException

    for session in (uuid.uuid4().hex, "../../etc/passwd", ""):
        with pytest.raises(InferenceServerException, match="session_id") as caught:
            push(client, session, "hello")
        assert "INVALID_ARG" in str(caught.value.status()) or "session_id:" in caught.value.message()
    assert client.is_server_live() and client.is_model_ready(TEXT_INBOX) and client.is_model_ready(BLS)


def test_a_session_without_text_ends_at_its_idle_timeout(server, client):
    from tritonclient.utils import InferenceServerException

    stream = Bistream(client, {"bistream_idle_timeout_s": 0.5})
    try:
        assert stream.next().size == 0
        push(client, stream.session, "你好")
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match="bistream_session: no text pushed for 0.5 s"):
            stream.next()
        assert time.monotonic() - started < scaled(30)
    finally:
        client.stop_stream()
    with pytest.raises(InferenceServerException, match="session_id"):
        push(client, stream.session, "late")


def test_bad_bistream_requests_are_refused_naming_the_field(server, client):
    from tritonclient.utils import InferenceServerException

    for parameters, field in (
        ({"bistream_session": "not-a-uuid"}, "bistream_session"),
        ({"bistream_idle_timeout_s": "soon"}, "bistream_idle_timeout_s"),
    ):
        stream = Bistream(client, parameters)
        try:
            with pytest.raises(InferenceServerException, match=f"{field}:"):
                stream.next()
        finally:
            client.stop_stream()
