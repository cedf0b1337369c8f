"""Disaggregated bistream: the CosyVoice2 BLS `cosyvoice2_http` (`llm_endpoint`: our OpenAI-compatible server's
`/v1/chat/completions`) runs a bistream request's segments as streamed `/v1/completions` requests beside it
(token-id prompt, the segment's end id as stop, `logit_bias` -100 bans, the BLS's seeded sampling).

Without the LLM server the request fails naming `llm_endpoint` and the Triton server goes on; with it the audio is
960 samples for each speech token of an LLM-level `run_bistream` over the offline in-Triton engine of the same
checkpoint (same seeded sampling, so the same tokens).
"""

from __future__ import annotations

import numpy as np
import pytest
from cosyvoice2_models import (
    HTTP_BLS,
    LLM_HTTP_PORT,
    PREFIX,
    TEXT_INBOX,
    build_cosyvoice2_models,
    checkpoint_paths,
)
from cosyvoice3_models import openai_llm_server
from test_bistream_triton import DELTAS, SAMPLES_PER_TOKEN, Bistream, expected_tokens, push

TRITON_MODELS = [build_cosyvoice2_models]
pytestmark = pytest.mark.slow
LEAVES = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm_offline")
UNLOAD_AFTER = (HTTP_BLS,)  # this module's own


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*(PREFIX + leaf for leaf in LEAVES), HTTP_BLS, TEXT_INBOX)


@pytest.fixture
def client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


def speak(client) -> list[np.ndarray]:
    """The stream's audio; a session the BLS ended early (its LLM failed) refuses the pushes after that, and
    the stream then carries the BLS's error."""
    from tritonclient.utils import InferenceServerException

    stream = Bistream(client, model=HTTP_BLS)
    try:
        assert stream.next().size == 0
        try:
            for delta in DELTAS:
                push(client, stream.session, delta)
            push(client, stream.session, "", final=True)
        except InferenceServerException as refused:
            assert "no bistream session" in str(refused)
        return stream.rest()
    finally:
        client.stop_stream()


def test_a_bistream_over_the_llm_server_fails_clearly_without_it_and_speaks_with_it(server, client, tmp_path):
    from tritonclient.utils import InferenceServerException

    with pytest.raises(
        InferenceServerException, match=r"llm_endpoint: LLM endpoint \S+/v1/completions: Connect"
    ):
        speak(client)
    assert client.is_server_live() and client.is_model_ready(HTTP_BLS)

    llm_dir = checkpoint_paths(server.repo.parent / "data" / build_cosyvoice2_models.__name__).llm_dir
    with openai_llm_server(llm_dir, tmp_path / "llm_server.log", llm_dir, LLM_HTTP_PORT):
        samples = np.concatenate(speak(client))
    tokens = expected_tokens(server, client, DELTAS)
    assert 18 <= len(tokens) and samples.size == len(tokens) * SAMPLES_PER_TOKEN
    assert 0 < np.abs(samples).max() <= 1.0
