"""Voice modes and saved voice profiles in the BLS models, on the real tritonserver (tiny synthetic checkpoints,
CPU): Spark-TTS voice creation, CosyVoice2 cross_lingual and instruct2 (and the DiT variant's), offline and
streamed; a `voice_profile` request and a request that brings the profile, which calls no front-end model
(Triton's inference counts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile
import tritonclient.grpc as grpcclient
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from spark_models import SPARK_SERVING, build_spark_models
from triton_stats import assert_counts, inference_count, inference_counts, wait_for_counts
from triton_stream import make_inputs, stream_responses, stream_waveforms
from tritonclient.utils import InferenceServerException
from voice_models import LLM, build_voice_spark_models

from tritontts.audio import load_wav
from tritontts.voice_profile import VoiceProfile

TRITON_MODELS = [
    build_spark_models,
    build_voice_spark_models,
    build_cosyvoice2_models,
    build_cosyvoice2_dit_models,
]
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
TARGET = "身临其境，换新体验。"
INSTRUCT = "用四川话说这句话<|endofprompt|>"
SPARK_HOP, COSY_SAMPLES_PER_TOKEN = 320, 960
TOKENIZER, EMBEDDING = PREFIX + "audio_tokenizer", PREFIX + "speaker_embedding"
COSY_LEAVES = (
    TOKENIZER,
    EMBEDDING,
    PREFIX + "token2wav",
    PREFIX + "tensorrt_llm",
    PREFIX + "tensorrt_llm_offline",
)
PROFILE_OUTPUTS = {
    "spark_tts": ["profile_global_tokens", "profile_semantic_tokens", "profile_checkpoint"],
    "cosyvoice2": [
        "profile_speech_tokens",
        "profile_speech_feat",
        "profile_spk_embedding",
        "profile_checkpoint",
    ],
    "cosyvoice2_dit": ["profile_speech_tokens", "profile_checkpoint"],
}


@pytest.fixture(scope="module")
def server(triton):
    spark = SPARK_SERVING
    cosy = (
        *COSY_LEAVES,
        TOKEN2WAV_DIT,
        "cosyvoice2",
        "cosyvoice2_offline",
        "cosyvoice2_dit",
        "cosyvoice2_dit_offline",
    )
    return triton.load(*spark, *LLM.values(), *LLM, *cosy)


@pytest.fixture(scope="module")
def reference(prompt_zh) -> np.ndarray:
    return load_wav(prompt_zh, 16000)[: 16000 * 3]


def text(value: str) -> np.ndarray:
    return np.array([[value.encode()]], dtype=object)


def with_reference(wav: np.ndarray, reference_text: str | None = None, **texts: str) -> dict:
    values = {
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
    }
    if reference_text is not None:
        values["reference_text"] = text(reference_text)
    return values | {name: text(value) for name, value in texts.items()}


def infer(server, model: str, values: dict, outputs=("waveform",), parameters=None) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        result = client.infer(model, make_inputs(values), outputs=requested, parameters=parameters)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


def audible(audio: np.ndarray) -> bool:
    return bool(audio.size and np.all(np.isfinite(audio)) and 0 < np.abs(audio).max() <= 1.0)


# Spark-TTS voice creation

CREATE = {"gender": "female", "pitch": "high", "speed": "low"}


def test_spark_voice_creation_offline(server):
    audio = infer(
        server,
        "voice_spark_tts_offline",
        {"target_text": text(TARGET)} | {k: text(v) for k, v in CREATE.items()},
    )
    audio = audio["waveform"].reshape(-1)
    assert audible(audio) and audio.size % SPARK_HOP == 0


def test_spark_voice_creation_streams(server):
    values = {"target_text": text(TARGET), "gender": text("male")}  # pitch and speed default to moderate
    chunks = stream_waveforms(server.grpc_url, "voice_spark_tts", values, {})
    assert len(chunks) >= 2 and all(audible(c) for c in chunks)


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"gender": "robot"}, "gender"),
        ({"gender": "male", "speed": "fast"}, "speed"),
        ({"pitch": "low"}, "gender"),
    ],
)
def test_spark_voice_creation_errors_name_the_field(server, extra, field):
    values = {"target_text": text(TARGET)} | {k: text(v) for k, v in extra.items()}
    with pytest.raises(InferenceServerException, match=f"{field}:"):
        infer(server, "voice_spark_tts_offline", values)


def test_spark_voice_creation_takes_no_reference(server, reference):
    values = with_reference(reference, "参考", target_text=TARGET, gender="male")
    with pytest.raises(InferenceServerException, match="reference_wav: voice creation"):
        infer(server, "spark_tts_offline", values)


def test_a_mode_the_model_lacks_is_refused_naming_the_field(server, reference):
    with pytest.raises(InferenceServerException, match="instruct_text"):
        infer(
            server,
            "spark_tts_offline",
            with_reference(reference, "", target_text=TARGET, instruct_text="Speak slowly."),
        )
    with pytest.raises(InferenceServerException, match="gender"):
        infer(server, "cosyvoice2_offline", {"target_text": text(TARGET), "gender": text("male")})


# CosyVoice2 cross_lingual and instruct2


@pytest.mark.parametrize("model", ["cosyvoice2_offline", "cosyvoice2_dit_offline"])
def test_cosyvoice2_cross_lingual_and_instruct2_offline(server, reference, model):
    count = {"min_new_tokens": 12, "max_new_tokens": 12}
    cross = infer(
        server,
        model,
        with_reference(reference, target_text=TARGET),
        parameters={"mode": "cross_lingual", **count},
    )
    instruct = infer(
        server, model, with_reference(reference, target_text=TARGET, instruct_text=INSTRUCT), parameters=count
    )
    for audio in (cross["waveform"].reshape(-1), instruct["waveform"].reshape(-1)):
        assert audible(audio) and audio.size == 12 * COSY_SAMPLES_PER_TOKEN


@pytest.mark.parametrize("model", ["cosyvoice2", "cosyvoice2_dit"])
def test_cosyvoice2_cross_lingual_and_instruct2_stream(server, reference, model):
    count = {"min_new_tokens": 40, "max_new_tokens": 40}
    for values, parameters in (
        (with_reference(reference, target_text=TARGET), {"mode": "cross_lingual", **count}),
        (
            with_reference(reference, target_text=TARGET, instruct_text=INSTRUCT),
            {"mode": "instruct2", **count},
        ),
    ):
        chunks = stream_waveforms(server.grpc_url, model, values, parameters)
        assert len(chunks) >= 2 and all(audible(c) for c in chunks)
        assert sum(c.size for c in chunks) == 40 * COSY_SAMPLES_PER_TOKEN


def test_cosyvoice2_instruct2_with_the_cached_speaker(server, prompt_zh):
    audio = infer(
        server,
        "cosyvoice2_offline",
        {"target_text": text(TARGET), "instruct_text": text(INSTRUCT)},
        parameters={"max_new_tokens": 8, "min_new_tokens": 8},
    )
    assert audible(audio["waveform"].reshape(-1))


@pytest.mark.parametrize(
    "values,parameters,field",
    [
        ({"reference_text": "参考"}, {"mode": "cross_lingual"}, "reference_text"),
        ({}, {"mode": "instruct2"}, "instruct_text"),
        ({"instruct_text": INSTRUCT}, {"mode": "cross_lingual"}, "instruct_text"),
        ({}, {"mode": "sft"}, "mode"),
    ],
)
def test_cosyvoice2_mode_errors_name_the_field(server, reference, values, parameters, field):
    request = with_reference(reference, target_text=TARGET, **values)
    with pytest.raises(InferenceServerException, match=f"{field}:"):
        infer(server, "cosyvoice2_offline", request, parameters=parameters)


# saved voice profiles


def profile_of(server, model: str, kind: str, reference: np.ndarray) -> VoiceProfile:
    outputs = infer(
        server,
        model,
        with_reference(reference, target_text="-"),
        PROFILE_OUTPUTS[kind],
        {"voice_profile": True},
    )
    return VoiceProfile.from_outputs(kind, outputs)


def test_spark_profile_spares_the_audio_tokenizer(server, reference):
    served = inference_counts(server, ("spark_tts_offline", "spark_tts"))
    profile = profile_of(server, "spark_tts_offline", "spark_tts", reference[:24000])
    assert profile.arrays["global_tokens"].shape == (32,) and profile.arrays["semantic_tokens"].size > 0
    streamed = stream_responses(
        server,
        "spark_tts",
        with_reference(reference[:24000], target_text="-"),
        PROFILE_OUTPUTS["spark_tts"],
        {"voice_profile": True},
    )
    assert (
        len(streamed) == 1
        and VoiceProfile.from_outputs("spark_tts", streamed[0]).arrays.keys() == profile.arrays.keys()
    )
    wait_for_counts(server, {m: n + 1 for m, n in served.items()})  # the profiles' tokenizer calls counted
    tokenizer = inference_count(server, "audio_tokenizer")
    values = {"reference_text": text("吃燕窝"), "target_text": text(TARGET)} | profile.request_arrays()
    audio = infer(
        server, "spark_tts_offline", values, parameters={"max_new_tokens": 20, "min_new_tokens": 20}
    )
    assert audible(audio["waveform"].reshape(-1))
    chunks = stream_waveforms(
        server.grpc_url, "spark_tts", values, {"max_new_tokens": 60, "min_new_tokens": 60}
    )
    assert len(chunks) == 2
    assert_counts(server, {"audio_tokenizer": tokenizer}, over={m: n + 2 for m, n in served.items()})


def test_cosyvoice2_profile_spares_tokenizer_and_speaker_models(server, reference):
    wav = reference[16000:]  # audio no earlier test sent: the BLS's voice cache does not know it
    before = inference_counts(server, (TOKENIZER, EMBEDDING))
    served = inference_counts(server, ("cosyvoice2_offline", "cosyvoice2"))
    profile = profile_of(server, "cosyvoice2_offline", "cosyvoice2", wav)
    once = {m: n + 1 for m, n in before.items()}
    assert_counts(server, once)
    tokens = profile.arrays["speech_tokens"]
    assert profile.arrays["speech_feat"].shape == (2 * tokens.size, 80) and profile.arrays[
        "spk_embedding"
    ].shape == (192,)
    values = {
        "reference_text": text(PROMPT_ZH_TEXT[:10]),
        "target_text": text(TARGET),
    } | profile.request_arrays()
    count = {"min_new_tokens": 40, "max_new_tokens": 40}
    audio = infer(server, "cosyvoice2_offline", values, parameters=count)["waveform"].reshape(-1)
    chunks = stream_waveforms(server.grpc_url, "cosyvoice2", values, count)
    instruct = {"target_text": text(TARGET), "instruct_text": text(INSTRUCT)} | profile.request_arrays()
    instructed = infer(server, "cosyvoice2_offline", instruct, parameters=count)["waveform"].reshape(-1)
    assert audio.size == sum(c.size for c in chunks) == instructed.size == 40 * COSY_SAMPLES_PER_TOKEN
    # over: the profile and two offline requests, one stream
    over = {"cosyvoice2_offline": served["cosyvoice2_offline"] + 3, "cosyvoice2": served["cosyvoice2"] + 1}
    assert_counts(server, once, over=over)


def test_dit_profile_spares_the_tokenizer_and_still_needs_the_audio(server, reference):
    wav = reference[8000:40000]
    served = inference_count(server, "cosyvoice2_dit_offline")
    profile = profile_of(server, "cosyvoice2_dit_offline", "cosyvoice2_dit", wav)
    wait_for_counts(server, {"cosyvoice2_dit_offline": served + 1})  # the profile's tokenizer call counted
    tokenizer = inference_count(server, TOKENIZER)
    values = with_reference(wav, PROMPT_ZH_TEXT[:10], target_text=TARGET) | profile.request_arrays()
    audio = infer(
        server, "cosyvoice2_dit_offline", values, parameters={"min_new_tokens": 12, "max_new_tokens": 12}
    )
    assert audible(audio["waveform"].reshape(-1))
    assert_counts(server, {TOKENIZER: tokenizer}, over={"cosyvoice2_dit_offline": served + 2})
    no_audio = {k: v for k, v in values.items() if not k.startswith("reference_wav")}
    with pytest.raises(InferenceServerException, match="reference_wav: is required with a voice profile"):
        infer(server, "cosyvoice2_dit_offline", no_audio)


def test_a_profile_of_another_checkpoint_is_refused(server, reference):
    profile = profile_of(server, "spark_tts_offline", "spark_tts", reference[:16000])
    stale = VoiceProfile("spark_tts", "0" * 24, profile.arrays)
    values = {"reference_text": text(""), "target_text": text(TARGET)} | stale.request_arrays()
    with pytest.raises(
        InferenceServerException, match="voice_checkpoint: the voice profile was made with checkpoint 0+"
    ):
        infer(server, "spark_tts_offline", values)
    both = values | profile.request_arrays() | with_reference(reference[:16000], "")
    with pytest.raises(InferenceServerException, match="voice_global_tokens: send either"):
        infer(server, "spark_tts_offline", both)


@pytest.mark.parametrize(
    "model,flags",
    [
        ("voice_spark_tts_offline", ["--gender", "female", "--pitch", "low"]),
        ("cosyvoice2_offline", ["--cross-lingual"]),
        ("cosyvoice2_offline", ["--instruct-text", INSTRUCT]),
    ],
)
def test_client_http_mode_flags(server, prompt_zh, tmp_path, model, flags):
    out, rate = tmp_path / "out.wav", 16000 if "spark" in model else 24000
    command = [
        sys.executable,
        str(ROOT / "client_http.py"),
        "--server-url",
        server.http_url,
        "--model-name",
        model,
    ]
    command += [
        "--reference-audio",
        str(prompt_zh),
        "--output-audio",
        str(out),
        "--sample-rate",
        str(rate),
        *flags,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    audio, written = soundfile.read(out)
    assert audio.size > 0 and written == rate


@pytest.mark.parametrize("model", ["spark_tts", "cosyvoice2"])
def test_the_profile_benchmark_runs(server, prompt_zh, tmp_path, model):
    """scripts/bench_voice_profile.py end to end on the CPU models (its numbers mean something on a GPU only)."""
    out = tmp_path / "bench.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench_voice_profile.py"), "--model", model]
    command += [
        "--server-url",
        server.grpc_url,
        "--reference-wav",
        str(prompt_zh),
        "--reference-seconds",
        "2",
    ]
    command += ["--requests", "2", "--warmup", "0", "--output", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert len(result["reference"]["samples_ms"]) == len(result["profile"]["samples_ms"]) == 2
    assert result["kind"] == model and result["median_gain_ms"] == pytest.approx(
        result["reference"]["median_ms"] - result["profile"]["median_ms"], abs=0.02
    )
