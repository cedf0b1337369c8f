"""CosyVoice3 on the real tritonserver with the tiny synthetic checkpoint (CPU, torch LLM engine, float32).

Audio is 24 kHz, 2 mel frames of 480 samples per speech token: N tokens make N * 960 samples. As upstream's BLS
does, a stream's chunk k re-vocodes every mel frame so far (the vocoder holds back the 8 frames its causal
convolutions look ahead at) and sends the samples past what it sent before, so chunks join end to end.
The LLM runs inside Triton (`cosyvoice3`, `cosyvoice3_offline`) or, as upstream's topology, behind our
OpenAI-compatible server (`cosyvoice3_http`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from bls_monitor import assert_monitor_runs_from_load, unused_copy
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_models import install_llm_engine, install_token2wav
from cosyvoice3_models import (
    MAX_NEW_TOKENS,
    PRE_LOOKAHEAD_LEN,
    PREFIX,
    TEMPLATES,
    TOKEN_HOP_LEN,
    build_cosyvoice3_models,
    checkpoint_root,
    install_bls,
    openai_llm_server,
)
from cosyvoice_triton import (
    BAD_REQUESTS,
    SAMPLES_PER_TOKEN,
    audible,
    check_chunks,
    check_refused_then_served,
    infer,
    tokens,
    with_changes,
)
from first_chunk_checks import same_audio_and_more_held_seconds
from tolerance import max_error, server_threads, within
from triton_stats import assert_counts, inference_count, inference_counts
from triton_stream import stream_waveforms
from tritonclient.utils import InferenceServerException

from tritontts.audio import load_wav
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice2.token2wav import StreamSchedule
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice3.wire import token2wav_arrays, vocoder_arrays

UNUSED = "cosyvoice3_unused"  # a copy of cosyvoice3_offline that no test sends a request to
PRIORITY_TOKEN2WAV, PRIORITY_LLM, PRIORITY_BLS = (
    PREFIX + m for m in ("token2wav_priority", "tensorrt_llm_priority", "priority")
)


def build_priority_models(repo: Path, data: Path) -> None:
    """The streaming BLS over a token2wav and an LLM engine with `first_chunk_priority` true."""
    root = checkpoint_root(data.parent / build_cosyvoice3_models.__name__).resolve()
    install_token2wav(TEMPLATES, repo, PRIORITY_TOKEN2WAV, root / MODEL_DIR, priority=True)
    install_llm_engine(repo, PRIORITY_LLM, root / LLM_DIR, True, 4, priority=True)
    install_bls(
        repo, PRIORITY_BLS, root, True, PRIORITY_LLM.removeprefix(PREFIX), token2wav=PRIORITY_TOKEN2WAV
    )


TRITON_MODELS = [build_cosyvoice3_models, unused_copy("cosyvoice3_offline", UNUSED), build_priority_models]
UNLOAD_AFTER = (PRIORITY_BLS, PRIORITY_TOKEN2WAV, PRIORITY_LLM)
OFFLINE, STREAMING, HTTP_LLM = "cosyvoice3_offline", "cosyvoice3", "cosyvoice3_http"
TOKENIZER, EMBEDDING, TOKEN2WAV, VOCODER = (
    PREFIX + m for m in ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder")
)
LLMS = (PREFIX + "tensorrt_llm", PREFIX + "tensorrt_llm_offline")
TARGET = "身临其境，换新体验。"
REFERENCE_TEXT = PROMPT_ZH_TEXT[:14]
SCHEDULE = StreamSchedule(TOKEN_HOP_LEN, PRE_LOOKAHEAD_LEN, exponential=True)
# The served mel against the same flow in this process, both with the server's torch threads: measured 0 on this
# machine's native kernel path; the flow's spread over kernel paths is 4.1e-6 (test_cosyvoice3_flow.py).
SERVED_MEL_BOUND = 1e-4


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(TOKENIZER, EMBEDDING, TOKEN2WAV, VOCODER, *LLMS, OFFLINE, STREAMING, HTTP_LLM)


@pytest.fixture(scope="module")
def model_dir(server) -> Path:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config(TOKEN2WAV, as_json=True)["config"]
    client.close()
    return Path(config["parameters"]["model_dir"]["string_value"])


@pytest.fixture(scope="module")
def llm_server(server, model_dir, tmp_path_factory):
    """`python -m tritontts.llm.openai_server` on the port the `cosyvoice3_http` BLS was configured with."""
    with openai_llm_server(model_dir, tmp_path_factory.mktemp("llm_server") / "server.log") as process:
        yield process


@pytest.fixture(scope="module")
def reference(prompt_zh) -> np.ndarray:
    return load_wav(prompt_zh, 16000)[: 16000 * 3]


def request(
    wav: np.ndarray | None, target_text: str = TARGET, reference_text: str | None = REFERENCE_TEXT
) -> dict:
    """Upstream client_grpc.py's inputs; without `wav`, none of the reference inputs (speaker "001")."""
    values = {"target_text": np.array([[target_text.encode()]], dtype=object)}
    if wav is not None:
        values |= {
            "reference_wav": wav.reshape(1, -1).astype(np.float32),
            "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        }
        if reference_text is not None:
            values["reference_text"] = np.array([[reference_text.encode()]], dtype=object)
    return values


def offline(server, values: dict, count: int) -> np.ndarray:
    return infer(server, OFFLINE, values, parameters=tokens(count)).reshape(-1)


def stream(server, values: dict, parameters: dict, model: str = STREAMING) -> list[np.ndarray]:
    return stream_waveforms(server.grpc_url, model, values, parameters)


def expected_chunk_sizes(count: int) -> list[int]:
    """Chunk k: the accumulated mel (2 frames per token before the 3 look-ahead tokens) less the vocoder's
    8 held-back frames, minus what was sent; the final call sends the rest of 2 * count frames."""
    sizes, sent = [], 0
    for chunk in SCHEDULE.plan(count):
        frames = 2 * count if chunk.finalize else 2 * (chunk.token_end - PRE_LOOKAHEAD_LEN) - 8
        sizes.append(frames * 480 - sent)
        sent += sizes[-1]
    return sizes


@pytest.mark.parametrize("voice", ["reference", "spk2info"])
def test_offline_exact_length(server, reference, voice):
    audio = offline(server, request(reference if voice == "reference" else None), 30)
    assert audio.size == 30 * SAMPLES_PER_TOKEN and audible(audio)


@pytest.mark.parametrize("voice", ["reference", "spk2info"])
def test_streaming_chunks_follow_upstreams_schedule_and_add_up(server, reference, voice):
    count = 60
    chunks = stream(server, request(reference if voice == "reference" else None), tokens(count))
    # exponential hops 15, 25: calls at 18 and 43 tokens, then the finalize call
    assert expected_chunk_sizes(count) == [10560, 24000, 23040]
    check_chunks(chunks, expected_chunk_sizes(count), count)


def test_upstream_client_http_json_with_padded_audio(server, reference):
    """upstream client_http.py's body: JSON data, the audio zero-padded to 10 s with its true length beside it."""
    padded = np.zeros((1, 160000), dtype=np.float32)
    padded[0, : reference.size] = reference
    inputs = [
        {"name": "reference_wav", "shape": [1, 160000], "datatype": "FP32", "data": padded.tolist()},
        {"name": "reference_wav_len", "shape": [1, 1], "datatype": "INT32", "data": [[reference.size]]},
        {"name": "reference_text", "shape": [1, 1], "datatype": "BYTES", "data": [REFERENCE_TEXT]},
        {"name": "target_text", "shape": [1, 1], "datatype": "BYTES", "data": [TARGET]},
    ]
    body = {"inputs": inputs, "parameters": tokens(20)}
    response = httpx.post(f"http://{server.http_url}/v2/models/{OFFLINE}/infer", json=body, timeout=300)
    assert response.status_code == 200, response.text
    audio = np.asarray(response.json()["outputs"][0]["data"], dtype=np.float32)
    assert audio.size == 20 * SAMPLES_PER_TOKEN and audible(audio)
    assert np.array_equal(audio, offline(server, request(reference), 20))


def test_reference_audio_without_text_is_upstreams_system_prompt_alone(server, reference):
    audio = offline(server, request(reference, reference_text=None), 12)
    assert audio.size == 12 * SAMPLES_PER_TOKEN and audible(audio)


def test_llm_behind_the_openai_server_gives_the_same_audio(server, llm_server, reference):
    """Upstream's topology (BLS → /v1/chat/completions SSE) and the in-Triton LLM: same prompt, same seed."""
    values = request(reference)
    over_http = stream(server, values, tokens(45), model=HTTP_LLM)
    in_triton = stream(server, values, tokens(45))
    assert [c.size for c in over_http] == [c.size for c in in_triton] == expected_chunk_sizes(45)
    assert np.array_equal(np.concatenate(over_http), np.concatenate(in_triton))


def test_concurrent_offline_and_streaming_requests(server, reference):
    wavs = [None if i % 4 == 0 else reference[: 8000 * (2 + i % 3)] * (0.5 + 0.1 * i) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        audios = list(pool.map(lambda w: offline(server, request(w), 20), wavs))
        streams = list(pool.map(lambda w: stream(server, request(w), tokens(40)), wavs[:4]))
    assert all(a.size == 20 * SAMPLES_PER_TOKEN and audible(a) for a in audios)
    assert all([c.size for c in s] == expected_chunk_sizes(40) for s in streams)


def test_without_token_bounds_generation_stops_by_max_new_tokens(server):
    total = sum(c.size for c in stream(server, request(None), {}))
    assert 0 < total <= MAX_NEW_TOKENS * SAMPLES_PER_TOKEN and total % SAMPLES_PER_TOKEN == 0


def test_repeated_reference_hits_the_voice_cache(server, reference):
    voice = reference[4000:36000] * 0.7
    before = inference_counts(server, (TOKENIZER, EMBEDDING))
    served = inference_count(server, OFFLINE)
    offline(server, request(voice), 10)
    first = {m: before[m] + 1 for m in before}
    assert_counts(server, first)
    offline(server, request(voice, target_text="同一个声音，另一句话。"), 10)
    assert_counts(server, first, over={OFFLINE: served + 2})  # the second request over: no call


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_request_names_the_field_and_the_server_keeps_serving(server, reference, case):
    good = request(reference[:16000])
    check_refused_then_served(lambda values, count: offline(server, values, count), good, BAD_REQUESTS[case])


def test_streaming_bad_request_gets_an_error_response(server, reference):
    with pytest.raises(InferenceServerException, match="target_text"):
        stream(
            server, with_changes(request(reference), target_text=np.array([[b" "]], dtype=object)), tokens(10)
        )
    assert sum(c.size for c in stream(server, request(None), tokens(10))) == 10 * SAMPLES_PER_TOKEN


def test_audio_tokenizer_gives_raw_v3_tokens(server, model_dir, reference):
    from tritontts.cosyvoice2.frontend import SpeechTokenizer

    wav = reference[:24000]
    expected = SpeechTokenizer(model_dir / "speech_tokenizer_v3.onnx")(wav)
    padded = np.concatenate([wav, np.zeros(8000, np.float32)])
    values = {
        "reference_wav": padded.reshape(1, -1),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
    }
    out = infer(server, TOKENIZER, values, output="prompt_speech_tokens")
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out.reshape(-1), expected)


@pytest.fixture(scope="module")
def local_flow(model_dir):
    from tritontts.cosyvoice3.flow import load_flow3

    return load_flow3(model_dir), load_spk2info(model_dir / "spk2info.pt")[DEFAULT_SPEAKER]


def target_tokens(count: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, count).astype(np.int32)


@pytest.mark.parametrize(
    ("count", "offset", "finalize"), [(25, None, None), (18, 0, False), (43, 15, False), (60, 40, True)]
)
def test_token2wav_takes_upstreams_bls_call_and_matches_the_flow(server, local_flow, count, offset, finalize):
    """The call upstream's BLS makes (raw ids, fp16 prompt, [[offset]], [[finalize]]) → mel [1, 80, T]."""
    flow, speaker = local_flow
    ids = target_tokens(count)
    prompt = (speaker.speech_token.numpy()[0], speaker.speech_feat.numpy()[0], speaker.embedding.numpy()[0])
    mel = infer(server, TOKEN2WAV, token2wav_arrays(ids, *prompt, offset, finalize), output="mel")
    usable = count if finalize in (None, True) else count - PRE_LOOKAHEAD_LEN
    assert mel.dtype == np.float32 and mel.shape == (1, 80, 2 * (usable - (offset or 0)))
    fp16 = [torch.from_numpy(a.astype(np.float16).astype(np.float32))[None] for a in prompt[1:]]
    with server_threads():
        expected = flow.inference(
            torch.from_numpy(ids)[None], torch.tensor([count]), speaker.speech_token, torch.tensor([prompt[0].size]),
            fp16[0], torch.tensor([fp16[0].shape[1]]), fp16[1], streaming=finalize is False,
            finalize=finalize is not False,
        )  # fmt: skip
    within("served mel", max_error(mel[0], expected[0, :, 2 * (offset or 0) :].numpy()), SERVED_MEL_BOUND)


def test_vocoder_takes_upstreams_call(server):
    mel = np.random.default_rng(0).normal(-4, 1, (80, 40)).astype(np.float32)
    final = infer(server, VOCODER, vocoder_arrays(mel, True), output="tts_speech")
    partial = infer(server, VOCODER, vocoder_arrays(mel, False), output="tts_speech")
    assert final.shape == (1, 40 * 480) and partial.shape == (1, 32 * 480)
    assert max_error(partial[0], final[0, : partial.shape[1]]) < 1e-5


BAD_LEAF_CALLS = {
    "id out of range": (TOKEN2WAV, lambda: token2wav_arrays(np.array([6561], np.int32)), "target_speech_tokens"),
    "prompt mel not 2 frames per token": (
        TOKEN2WAV,
        lambda: token2wav_arrays(target_tokens(5), target_tokens(4), np.zeros((7, 80)), np.ones(192)),
        "prompt_speech_feat",
    ),
    "offset past the tokens": (TOKEN2WAV, lambda: token2wav_arrays(target_tokens(10), token_offset=8, finalize=False), "token_offset"),
    "mel too short for a partial call": (VOCODER, lambda: vocoder_arrays(np.zeros((80, 6)), False), "mel"),
    "no finalize": (VOCODER, lambda: {"mel": np.zeros((1, 80, 20), np.float32)}, "finalize"),
}  # fmt: skip


@pytest.mark.parametrize("case", BAD_LEAF_CALLS)
def test_bad_leaf_calls_name_the_field(server, case):
    model, make, field = BAD_LEAF_CALLS[case]
    output = "mel" if model == TOKEN2WAV else "tts_speech"
    with pytest.raises(InferenceServerException, match=field):
        infer(server, model, make(), output=output)


def test_bls_instances_watch_their_callees_from_load(triton, server):
    assert_monitor_runs_from_load(triton, UNUSED, instances=1)  # bls_instance_num


def test_first_chunk_priority_gives_the_same_audio_and_holds_the_llm(triton, server, reference):
    """CosyVoice3's token2wav marks the first-chunk board as CosyVoice2's does (tests/test_first_chunk_priority.py)."""
    triton.load(PRIORITY_TOKEN2WAV, PRIORITY_LLM, PRIORITY_BLS)
    same_audio_and_more_held_seconds(server, STREAMING, PRIORITY_BLS, PRIORITY_LLM, request(reference))
