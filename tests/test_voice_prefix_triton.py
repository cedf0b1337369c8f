"""The voice prefix cache (docs/gpu-hosts.md#voice-prefix-cache) through the real tritonserver: the tiny synthetic
CosyVoice2 token2wav with `voice_prefix_gib` on streams the audio the one without it streams, and reports the
prefix it keeps."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cosyvoice2_models import PREFIX, TEMPLATES, build_cosyvoice2_models, checkpoint_paths, install_token2wav
from triton_stream import make_inputs
from waiting import wait_until

from tritontts.bench.server_stages import scrape
from tritontts.cosyvoice2.wire import token2wav_arrays

TOKEN2WAV, PREFIXED = PREFIX + "token2wav", PREFIX + "token2wav_prefixed"
PROMPT_TOKENS = 60
"""two whole chunks of 25 tokens stay the same whatever follows them (a 100-frame prefix)"""


def build_prefixed_token2wav(repo, data) -> None:
    model_dir = checkpoint_paths(data.parent / build_cosyvoice2_models.__name__).model_dir.resolve()
    install_token2wav(TEMPLATES, repo, PREFIXED, model_dir, voice_prefix_gib=0.5)


TRITON_MODELS = [build_cosyvoice2_models, build_prefixed_token2wav]
UNLOAD_AFTER = (PREFIXED,)


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(TOKEN2WAV, PREFIXED)


def _stream(server, model: str, stream: str, prompt: tuple, target: np.ndarray) -> list[np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    pieces = []
    try:
        for offset, end, finalize in ((0, 28, False), (25, 53, False), (50, len(target), True)):
            arrays = token2wav_arrays(target[:end], *prompt, token_offset=offset, finalize=finalize)
            result = client.infer(model, make_inputs(arrays), request_id=stream)
            pieces.append(result.as_numpy("waveform").reshape(-1))
    finally:
        client.close()
    return pieces


def _prefix_gauges(server) -> dict[str, float]:
    url = f"http://127.0.0.1:{server.server.config.metrics_port}/metrics"
    return {
        name: value
        for (name, labels), value in scrape(url).items()
        if name.startswith("tritontts_token2wav_voice_prefix") and dict(labels).get("model") == PREFIXED
    }


def test_streams_with_the_voice_prefix_cache_sound_as_without_and_its_prefix_is_reported(server):
    rng = np.random.default_rng(3)
    prompt = (
        rng.integers(0, 6561, PROMPT_TOKENS).astype(np.int32),
        rng.standard_normal((2 * PROMPT_TOKENS, 80)).astype(np.float16),
        rng.standard_normal(192).astype(np.float16),
    )
    targets = [rng.integers(0, 6561, 60).astype(np.int32) for _ in range(2)]
    for i, target in enumerate(targets):
        plain = _stream(server, TOKEN2WAV, f"plain-{i}", prompt, target)
        cached = _stream(server, PREFIXED, f"cached-{i}", prompt, target)
        for a, b in zip(cached, plain):
            np.testing.assert_allclose(a, b, atol=1e-3)
    gauges = wait_until(
        lambda: _prefix_gauges(server),
        lambda g: (
            g.get("tritontts_token2wav_voice_prefixes_made") == 1
            and g.get("tritontts_token2wav_voice_prefix_bytes", 0) > 0
        ),
        "the prefixed token2wav reports one voice prefix made and kept",
        timeout=10,
    )
    assert gauges["tritontts_token2wav_voice_prefix_bytes"] <= 0.5 * 2**30
