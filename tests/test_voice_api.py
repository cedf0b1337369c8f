"""The speech API's voices beyond saved files, on the real tritonserver (tiny synthetic Spark-TTS and CosyVoice2,
CPU), through the official `openai` client and raw HTTP: instructions, speed, per-request references (JSON base64
and multipart), Spark-TTS voice creation, and the voice profile lifecycle (upload with profiles, list, use without
any front-end model call, restart of the API, a profile of another checkpoint, delete, concurrent uploads)."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import soundfile
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_dit_models import TOKEN2WAV_DIT, build_cosyvoice2_dit_models
from cosyvoice2_models import PREFIX, build_cosyvoice2_models
from openai_api_process import api_process, decode
from spark_models import SPARK_SERVING, build_spark_models
from triton_stats import assert_counts, inference_count, inference_counts
from voice_models import LLM, build_voice_spark_models

from tritontts.voice_profile import VoiceProfile

TRITON_MODELS = [
    build_spark_models,
    build_voice_spark_models,
    build_cosyvoice2_models,
    build_cosyvoice2_dit_models,
]
pytestmark = pytest.mark.slow
KEY = "test-key"
TEXT = "身临其境，换新体验。"
MODELS = {
    "spark-tts": "spark_tts,spark_tts_offline",
    "spark-create": "voice_spark_tts,voice_spark_tts_offline,sample_rate=16000",
    "cosyvoice2": "cosyvoice2,cosyvoice2_offline",
    "cosyvoice2-dit": "cosyvoice2_dit,cosyvoice2_dit_offline",
}
FRONT_ENDS = {  # the models a profile spares, per route
    "spark-tts": ("audio_tokenizer",),
    "cosyvoice2": (PREFIX + "audio_tokenizer", PREFIX + "speaker_embedding"),
    "cosyvoice2-dit": (PREFIX + "audio_tokenizer",),
}
RATES = {"spark-tts": 16000, "spark-create": 16000, "cosyvoice2": 24000, "cosyvoice2-dit": 24000}
HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(triton):
    spark = SPARK_SERVING
    leaves = ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm", "tensorrt_llm_offline")
    cosy = (*(PREFIX + leaf for leaf in leaves), TOKEN2WAV_DIT)
    bls = ("cosyvoice2", "cosyvoice2_offline", "cosyvoice2_dit", "cosyvoice2_dit_offline")
    return triton.load(*spark, *LLM.values(), *LLM, *cosy, *bls)


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("voices")


def start_api(server, voices_dir, log_dir):
    args = ["--triton-url", server.grpc_url, "--voices-dir", str(voices_dir), "--api-key", KEY]
    args += ["--max-upload-bytes=3000000", "--max-reference-seconds=10"]
    for name, models in MODELS.items():
        args += ["--model", f"{name}={models}"]
    return api_process(*args, log_file=log_dir / "api.log")


@pytest.fixture(scope="module")
def api(server, voices_dir, tmp_path_factory):
    with start_api(server, voices_dir, tmp_path_factory.mktemp("api")) as url:
        yield url


@pytest.fixture(scope="module")
def client(api):
    return openai.OpenAI(base_url=f"{api}/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def reference_wav(prompt_zh) -> bytes:
    """3 s of the prompt as a 24 kHz WAV file (uploads are resampled to 16 kHz)."""
    samples, rate = soundfile.read(prompt_zh, dtype="float32")
    buffer = io.BytesIO()
    soundfile.write(buffer, samples[: 3 * rate], rate, format="WAV")
    return buffer.getvalue()


def upload(api, name: str, audio: bytes, transcript: str = PROMPT_ZH_TEXT[:14]) -> httpx.Response:
    files = {"audio_sample": ("ref.wav", audio, "audio/wav")}
    data = {"name": name, "transcript": transcript}
    return httpx.post(f"{api}/v1/audio/voices", files=files, data=data, headers=HEADERS, timeout=300)


def speech(api, **body) -> httpx.Response:
    body = {"input": TEXT, "response_format": "wav"} | body
    return httpx.post(f"{api}/v1/audio/speech", json=body, headers=HEADERS, timeout=300)


def audio_of(response, model: str) -> np.ndarray:
    assert response.status_code == 200, response.text
    samples, rate = decode(response.content, "wav", 0)
    assert rate == RATES[model] and samples.size > 0 and np.abs(samples).max() > 0
    return samples


def front_end_counts(server) -> dict[str, int]:
    return inference_counts(server, (m for models in FRONT_ENDS.values() for m in models))


def route_models(model: str) -> tuple[str, str]:
    """The (streaming, offline) BLS of an API model: counted once a request through them is over."""
    streaming, offline = MODELS[model].split(",")[:2]
    return streaming, offline


def error_of(response, status: int, param: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    return error["message"]


# voice profiles


def test_an_uploaded_voice_gets_a_profile_per_family(api, voices_dir, reference_wav):
    response = upload(api, "alice", reference_wav)
    assert response.status_code == 201, response.text
    assert sorted(response.json()["profiles"]) == ["cosyvoice2", "cosyvoice2_dit", "spark_tts"]
    assert {p.name for p in voices_dir.iterdir()} == {
        "alice.wav",
        "alice.txt",
        "alice.spark_tts.npz",
        "alice.cosyvoice2.npz",
        "alice.cosyvoice2_dit.npz",
    }
    listed = httpx.get(f"{api}/v1/audio/voices", headers=HEADERS, timeout=30).json()["data"]
    assert [(v["id"], sorted(v["profiles"])) for v in listed] == [
        ("alice", ["cosyvoice2", "cosyvoice2_dit", "spark_tts"])
    ]


@pytest.mark.parametrize("model", FRONT_ENDS)
def test_a_saved_voice_calls_no_front_end_model(api, client, server, model):
    before = front_end_counts(server)
    served = inference_counts(server, route_models(model))
    response = client.audio.speech.create(model=model, voice="alice", input=TEXT, response_format="wav")
    samples, rate = decode(response.content, "wav", 0)
    assert rate == RATES[model] and samples.size > 0
    body = {
        "model": model,
        "voice": "alice",
        "input": TEXT,
        "response_format": "pcm",
        "stream_format": "audio",
    }
    with httpx.stream("POST", f"{api}/v1/audio/speech", json=body, headers=HEADERS, timeout=300) as streamed:
        assert streamed.status_code == 200 and b"".join(streamed.iter_raw())
    assert_counts(server, before, over={m: n + 1 for m, n in served.items()})  # one request each


def test_a_voice_without_profile_still_sends_its_audio(api, server, voices_dir, reference_wav):
    samples, rate = soundfile.read(io.BytesIO(reference_wav), dtype="float32")
    soundfile.write(voices_dir / "copied.wav", samples[: 2 * rate], rate)  # placed by hand: no profile
    (voices_dir / "copied.txt").write_text("吃燕窝\n", encoding="utf-8")
    before = inference_count(server, "audio_tokenizer")
    audio_of(speech(api, model="spark-tts", voice="copied"), "spark-tts")
    assert_counts(server, {"audio_tokenizer": before + 1})


def test_a_profile_of_another_checkpoint_is_made_again(api, server, voices_dir):
    path = voices_dir / "alice.spark_tts.npz"
    good = VoiceProfile.from_bytes(path.read_bytes())
    path.write_bytes(VoiceProfile("spark_tts", "0" * 24, good.arrays).to_bytes())
    before, served = inference_count(server, "audio_tokenizer"), inference_count(server, "spark_tts_offline")
    audio_of(speech(api, model="spark-tts", voice="alice"), "spark-tts")
    assert VoiceProfile.from_bytes(path.read_bytes()).checkpoint == good.checkpoint
    # the profile, made once more (the offline BLS: the stale profile refused, the new profile, the speech)
    assert_counts(server, {"audio_tokenizer": before + 1}, over={"spark_tts_offline": served + 2})
    audio_of(speech(api, model="spark-tts", voice="alice"), "spark-tts")
    assert_counts(server, {"audio_tokenizer": before + 1}, over={"spark_tts_offline": served + 3})


def test_profiles_outlive_a_restart_and_delete_removes_everything(
    server, voices_dir, tmp_path, reference_wav, api
):
    with start_api(
        server, voices_dir, tmp_path
    ) as other:  # another replica, then a restarted one: same folder
        listed = httpx.get(f"{other}/v1/audio/voices", headers=HEADERS, timeout=30).json()["data"]
        assert "alice" in [v["id"] for v in listed]
        client = openai.OpenAI(base_url=f"{other}/v1", api_key=KEY, max_retries=0, timeout=300)
        before, served = front_end_counts(server), inference_count(server, "cosyvoice2_offline")
        client.audio.speech.create(model="cosyvoice2", voice="alice", input=TEXT, response_format="wav")
        assert_counts(server, before, over={"cosyvoice2_offline": served + 1})
        with ThreadPoolExecutor(2) as pool:  # two replicas take one name at once: one wins
            codes = sorted(pool.map(lambda url: upload(url, "erin", reference_wav).status_code, [api, other]))
        assert codes == [201, 409]
        deleted = httpx.delete(f"{other}/v1/audio/voices/alice", headers=HEADERS, timeout=30)
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    assert not [p for p in voices_dir.iterdir() if p.name.startswith("alice.")]
    error_of(speech(api, model="spark-tts", voice="alice"), 404, "voice")
    error_of(httpx.delete(f"{api}/v1/audio/voices/alice", headers=HEADERS, timeout=30), 404, "name")
    assert httpx.delete(f"{api}/v1/audio/voices/erin", timeout=30).status_code == 401


# instructions, speed, voice creation


def test_instructions_follow_cosyvoice2s_instruct_mode(client):
    for model in ("cosyvoice2", "cosyvoice2-dit"):
        response = client.audio.speech.create(
            model=model, voice="erin", input=TEXT, instructions="用四川话说这句话", response_format="wav"
        )
        samples, rate = decode(response.content, "wav", 0)
        assert rate == 24000 and samples.size > 0


def test_instructions_where_the_model_has_none_are_400(client):
    with pytest.raises(openai.BadRequestError) as error:
        client.audio.speech.create(model="spark-tts", voice="erin", input=TEXT, instructions="Speak slowly.")
    assert error.value.body["param"] == "instructions" and "no instruct mode" in error.value.body["message"]


def test_speed_creates_a_spark_voice_or_is_refused(api, client):
    response = client.audio.speech.create(
        model="spark-create",
        voice={"gender": "female", "pitch": "high"},
        input=TEXT,
        speed=1.3,
        response_format="wav",
    )
    samples, rate = decode(response.content, "wav", 0)
    assert rate == 16000 and samples.size > 0
    assert "speed 1.3 is not supported" in error_of(
        speech(api, model="spark-tts", voice="erin", speed=1.3), 400, "speed"
    )
    both = speech(api, model="spark-create", voice={"gender": "male", "speed": "low"}, speed=1.3)
    error_of(both, 400, "speed")


def test_voice_creation_streams_and_vllm_omni_task_type(api):
    body = {"model": "spark-create", "voice": {"gender": "male"}, "input": TEXT, "task_type": "VoiceDesign"}
    body |= {"response_format": "pcm", "stream_format": "audio"}
    with httpx.stream("POST", f"{api}/v1/audio/speech", json=body, headers=HEADERS, timeout=300) as response:
        assert response.status_code == 200
        samples, _ = decode(b"".join(response.iter_raw()), "pcm", 16000)
    assert samples.size > 0
    error_of(speech(api, model="spark-create", voice="erin", task_type="VoiceDesign"), 400, "voice")
    error_of(speech(api, model="cosyvoice2", voice={"gender": "male"}), 400, "voice")
    error_of(speech(api, model="spark-create", voice={"gender": "robot"}), 400, "voice")


# per-request references


def test_ref_audio_in_json_with_and_without_ref_text(api, server, reference_wav):
    encoded = base64.b64encode(reference_wav).decode()
    audio_of(speech(api, model="spark-tts", ref_audio=encoded, ref_text=PROMPT_ZH_TEXT[:14]), "spark-tts")
    before = inference_count(server, "cosyvoice2_offline")
    uri = "data:audio/wav;base64," + encoded
    audio_of(speech(api, model="cosyvoice2", ref_audio=uri), "cosyvoice2")  # no transcript: cross-lingual
    assert_counts(server, {"cosyvoice2_offline": before + 1})


def test_ref_audio_as_a_multipart_upload(api, reference_wav):
    files = {"ref_audio": ("ref.wav", reference_wav, "audio/wav")}
    data = {
        "model": "cosyvoice2-dit",
        "input": TEXT,
        "ref_text": PROMPT_ZH_TEXT[:14],
        "response_format": "wav",
    }
    response = httpx.post(f"{api}/v1/audio/speech", files=files, data=data, headers=HEADERS, timeout=300)
    audio_of(response, "cosyvoice2-dit")
    data = {"model": "spark-create", "input": TEXT, "voice": '{"gender": "female"}', "response_format": "wav"}
    audio_of(httpx.post(f"{api}/v1/audio/speech", data=data, headers=HEADERS, timeout=300), "spark-create")


def test_ref_audio_errors(api, reference_wav):
    samples, rate = soundfile.read(io.BytesIO(reference_wav), dtype="float32")
    long = io.BytesIO()
    soundfile.write(long, np.tile(samples, 4), rate, format="WAV")  # 12 s: over --max-reference-seconds
    too_long = base64.b64encode(long.getvalue()).decode()
    assert "10" in error_of(speech(api, model="spark-tts", ref_audio=too_long), 400, "ref_audio")
    error_of(speech(api, model="spark-tts", ref_audio="https://example.com/a.wav"), 400, "ref_audio")
    error_of(speech(api, model="spark-tts", ref_audio="%%%"), 400, "ref_audio")
    error_of(
        speech(api, model="spark-tts", ref_audio=base64.b64encode(b"not audio").decode()), 400, "ref_audio"
    )
    error_of(speech(api, model="spark-tts", voice="erin", ref_audio=too_long), 400, "ref_audio")
    error_of(speech(api, model="spark-tts", ref_text="only text"), 400, "ref_text")
    error_of(speech(api, model="spark-tts"), 400, "voice")


def test_a_large_reference_goes_as_a_file_part(api):
    """JSON bodies keep --max-request-bytes (1 MiB); a multipart body may be as large as a voice upload."""
    rate = 48000
    t = np.arange(9 * rate) / rate
    buffer = io.BytesIO()
    soundfile.write(
        buffer, (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), rate, format="WAV", subtype="FLOAT"
    )
    large = buffer.getvalue()
    assert 1 << 20 < len(large) < 3_000_000
    response = speech(api, model="spark-tts", ref_audio=base64.b64encode(large).decode())
    assert response.status_code == 413, response.text
    files = {"ref_audio": ("large.wav", large, "audio/wav")}
    data = {"model": "spark-tts", "input": TEXT, "response_format": "wav"}
    audio_of(
        httpx.post(f"{api}/v1/audio/speech", files=files, data=data, headers=HEADERS, timeout=300),
        "spark-tts",
    )
