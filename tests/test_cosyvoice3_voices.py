"""CosyVoice3's voice modes and saved voice profiles on the real tritonserver (tiny synthetic checkpoint, CPU):
cross_lingual and instruct2 offline, streamed and with the LLM behind the OpenAI-compatible server; errors naming
the field; a `voice_profile` request, and requests bringing that profile, which call neither the audio_tokenizer
nor the speaker_embedding (Triton's inference counts); a profile of another checkpoint refused. The prompts
themselves are checked against upstream's construction in tests/test_cosyvoice3_llm.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import PROMPT_ZH_TEXT
from cosyvoice3_models import PREFIX, build_cosyvoice3_models, openai_llm_server
from cosyvoice_triton import SAMPLES_PER_TOKEN, audible, tokens
from triton_stats import inference_count
from triton_stream import make_inputs, stream_responses, stream_waveforms
from tritonclient.utils import InferenceServerException

from tritontts.audio import load_wav
from tritontts.voice_profile import KIND_ARRAYS, OUTPUT_PREFIX, VoiceProfile

TRITON_MODELS = [build_cosyvoice3_models]
pytestmark = pytest.mark.slow
OFFLINE, STREAMING, HTTP_LLM = "cosyvoice3_offline", "cosyvoice3", "cosyvoice3_http"
TOKENIZER, EMBEDDING = PREFIX + "audio_tokenizer", PREFIX + "speaker_embedding"
LEAVES = (TOKENIZER, EMBEDDING, PREFIX + "token2wav", PREFIX + "vocoder")
LLMS = (PREFIX + "tensorrt_llm", PREFIX + "tensorrt_llm_offline")
TARGET = "身临其境，换新体验。"
INSTRUCT = (
    "请用广东话表达。"  # the BLS puts it in upstream's form: "You are a helpful assistant. …<|endofprompt|>"
)
UPSTREAM_INSTRUCT = "You are a helpful assistant. 请用尽可能快地语速说一句话。<|endofprompt|>"
PROFILE_OUTPUTS = [OUTPUT_PREFIX + name for name in KIND_ARRAYS["cosyvoice3"]] + ["profile_checkpoint"]
MODES = [
    ({}, {"mode": "cross_lingual"}),
    ({}, {"mode": "cross_lingual", "target_text": "You are a helpful assistant.<|endofprompt|>" + TARGET}),
    ({"instruct_text": INSTRUCT}, {}),
    ({"instruct_text": UPSTREAM_INSTRUCT}, {"mode": "instruct2"}),
]


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*LEAVES, *LLMS, OFFLINE, STREAMING, HTTP_LLM)


@pytest.fixture(scope="module")
def llm_server(server, tmp_path_factory):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    config = client.get_model_config(PREFIX + "token2wav", as_json=True)["config"]
    client.close()
    model_dir = Path(config["parameters"]["model_dir"]["string_value"])
    with openai_llm_server(model_dir, tmp_path_factory.mktemp("llm_server") / "server.log") as process:
        yield process


@pytest.fixture(scope="module")
def reference(prompt_zh) -> np.ndarray:
    return load_wav(prompt_zh, 16000)[: 16000 * 3]


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=object)


def values_of(wav: np.ndarray | None, texts: dict, parameters: dict) -> tuple[dict, dict]:
    """A request's inputs and parameters; a `target_text` in `parameters` replaces TARGET."""
    parameters = dict(parameters)
    values = {"target_text": text(parameters.pop("target_text", TARGET))}
    values |= {name: text(value) for name, value in texts.items()}
    if wav is not None:
        values |= {
            "reference_wav": wav.reshape(1, -1).astype(np.float32),
            "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        }
    return values, parameters


def infer(server, model: str, values: dict, outputs=("waveform",), parameters=None) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = client.infer(model, make_inputs(values), outputs=requested, parameters=parameters)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


@pytest.mark.parametrize("texts,parameters", MODES)
def test_each_mode_offline_gives_audio_of_the_exact_length(server, reference, texts, parameters):
    values, parameters = values_of(reference, texts, parameters)
    audio = infer(server, OFFLINE, values, parameters=parameters | tokens(12))["waveform"].reshape(-1)
    assert audible(audio) and audio.size == 12 * SAMPLES_PER_TOKEN


@pytest.mark.parametrize("model", [STREAMING, HTTP_LLM])
@pytest.mark.parametrize("texts,parameters", [MODES[0], MODES[2]])
def test_each_mode_streams_audio_of_the_exact_length(server, llm_server, reference, model, texts, parameters):
    values, parameters = values_of(reference, texts, parameters)
    chunks = stream_waveforms(server.grpc_url, model, values, parameters | tokens(40))
    assert len(chunks) >= 2 and all(audible(c) for c in chunks)
    assert sum(c.size for c in chunks) == 40 * SAMPLES_PER_TOKEN


def test_instruct2_with_the_cached_speaker(server):
    values, _ = values_of(None, {"instruct_text": INSTRUCT}, {})
    audio = infer(server, OFFLINE, values, parameters=tokens(8))["waveform"].reshape(-1)
    assert audible(audio) and audio.size == 8 * SAMPLES_PER_TOKEN


@pytest.mark.parametrize(
    "texts,parameters,field",
    [
        ({"reference_text": "参考"}, {"mode": "cross_lingual"}, "reference_text"),
        ({"reference_text": "参考", "instruct_text": INSTRUCT}, {}, "reference_text"),
        ({}, {"mode": "instruct2"}, "instruct_text"),
        ({"instruct_text": INSTRUCT}, {"mode": "cross_lingual"}, "instruct_text"),
        ({"instruct_text": ""}, {}, "instruct_text"),
        ({}, {"mode": "sft"}, "mode"),
        ({}, {"voice_profile": "yes"}, "voice_profile"),
    ],
)
def test_mode_errors_name_the_field(server, reference, texts, parameters, field):
    values, parameters = values_of(reference, texts, parameters)
    with pytest.raises(InferenceServerException, match=f"{field}:"):
        infer(server, OFFLINE, values, parameters=parameters)


def profile_of(server, model: str, wav: np.ndarray) -> VoiceProfile:
    values, _ = values_of(wav, {}, {})
    outputs = infer(server, model, values, PROFILE_OUTPUTS, {"voice_profile": True})
    return VoiceProfile.from_outputs("cosyvoice3", outputs)


def front_end_counts(server) -> tuple[int, int]:
    return inference_count(server, TOKENIZER), inference_count(server, EMBEDDING)


def test_a_profile_spares_the_tokenizer_and_speaker_models(server, reference):
    wav = reference[16000:]  # audio no other test sent: the BLS's voice cache does not know it
    before = front_end_counts(server)
    profile = profile_of(server, OFFLINE, wav)
    assert front_end_counts(server) == (before[0] + 1, before[1] + 1)
    speech_tokens = profile.arrays["speech_tokens"]
    assert speech_tokens.size > 0 and profile.arrays["speech_feat"].shape == (2 * speech_tokens.size, 80)
    assert profile.arrays["spk_embedding"].shape == (192,)
    with_profile = {"reference_text": text(PROMPT_ZH_TEXT[:10]), "target_text": text(TARGET)}
    with_profile |= profile.request_arrays()
    audio = infer(server, OFFLINE, with_profile, parameters=tokens(40))["waveform"].reshape(-1)
    chunks = stream_waveforms(server.grpc_url, STREAMING, with_profile, tokens(40))
    instruct = {"target_text": text(TARGET), "instruct_text": text(INSTRUCT)} | profile.request_arrays()
    instructed = infer(server, OFFLINE, instruct, parameters=tokens(40))["waveform"].reshape(-1)
    cross = {"target_text": text(TARGET)} | profile.request_arrays()
    crossed = stream_waveforms(server.grpc_url, STREAMING, cross, {"mode": "cross_lingual"} | tokens(40))
    sizes = (audio.size, sum(c.size for c in chunks), instructed.size, sum(c.size for c in crossed))
    assert sizes == (40 * SAMPLES_PER_TOKEN,) * 4 and audible(audio) and audible(instructed)
    assert front_end_counts(server) == (before[0] + 1, before[1] + 1)


def test_the_stream_model_answers_a_profile_request_once(server, reference):
    values, _ = values_of(reference[:24000], {}, {})
    responses = stream_responses(server, STREAMING, values, PROFILE_OUTPUTS, {"voice_profile": True})
    assert len(responses) == 1
    profile = VoiceProfile.from_outputs("cosyvoice3", responses[0])
    offline = profile_of(server, OFFLINE, reference[:24000])
    assert profile.checkpoint == offline.checkpoint
    for name in KIND_ARRAYS["cosyvoice3"]:
        np.testing.assert_array_equal(profile.arrays[name], offline.arrays[name])


def test_a_profile_of_another_checkpoint_or_shape_is_refused(server, reference):
    profile = profile_of(server, OFFLINE, reference[:16000])
    stale = VoiceProfile("cosyvoice3", "0" * 24, profile.arrays)
    values = {"target_text": text(TARGET)} | stale.request_arrays()
    with pytest.raises(InferenceServerException, match="voice_checkpoint: the voice profile was made with"):
        infer(server, OFFLINE, values)
    short = dict(profile.arrays, speech_feat=profile.arrays["speech_feat"][:-2])
    values = {"target_text": text(TARGET)} | VoiceProfile(
        "cosyvoice3", profile.checkpoint, short
    ).request_arrays()
    with pytest.raises(InferenceServerException, match="voice_speech_feat: must be"):
        infer(server, OFFLINE, values)
    both = values_of(reference[:16000], {}, {})[0] | profile.request_arrays()
    with pytest.raises(InferenceServerException, match="voice_speech_tokens: send either"):
        infer(server, OFFLINE, both)
