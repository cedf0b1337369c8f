"""CosyVoice2's front end over the synthetic speech tokenizer and CAMPPlus ONNX files."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from tritontts.audio import AudioError, load_wav
from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.frontend import (
    CODEBOOK_SIZE,
    CosyVoice2Frontend,
    SpeakerEmbedder,
    SpeechTokenizer,
    align_prompt_lengths,
    create_session,
    prompt_speech_feat,
    speech_token_count,
)
from tritontts.synthetic.cosyvoice2_onnx import (
    write_campplus_onnx,
    write_frontend_onnx,
    write_speech_tokenizer_onnx,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_frontend_onnx(tmp_path_factory.mktemp("cosyvoice2_frontend"), preset="tiny", seed=0)


@pytest.fixture(scope="module")
def frontend(model_dir) -> CosyVoice2Frontend:
    return CosyVoice2Frontend.from_model_dir(model_dir)


@pytest.fixture(scope="module")
def speech(prompt_zh) -> np.ndarray:
    return load_wav(prompt_zh, 16000)


def test_synthetic_files_have_the_official_io(model_dir):
    tokenizer = ort.InferenceSession(str(model_dir / "speech_tokenizer_v2.onnx"))
    assert [(i.name, i.type, len(i.shape)) for i in tokenizer.get_inputs()] == [
        ("feats", "tensor(float)", 3),
        ("feats_length", "tensor(int32)", 1),
    ]
    assert tokenizer.get_inputs()[0].shape[1] == 128
    assert [(o.name, o.type) for o in tokenizer.get_outputs()] == [("indices", "tensor(int32)")]
    campplus = ort.InferenceSession(str(model_dir / "campplus.onnx"))
    assert [(i.name, i.type, i.shape[2]) for i in campplus.get_inputs()] == [("input", "tensor(float)", 80)]
    assert [(o.name, o.type, o.shape[1]) for o in campplus.get_outputs()] == [
        ("output", "tensor(float)", 192)
    ]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    first = write_speech_tokenizer_onnx(tmp_path / "a.onnx", "tiny", seed=3).read_bytes()
    assert write_speech_tokenizer_onnx(tmp_path / "b.onnx", "tiny", seed=3).read_bytes() == first
    assert write_speech_tokenizer_onnx(tmp_path / "c.onnx", "tiny", seed=4).read_bytes() != first
    campplus = write_campplus_onnx(tmp_path / "d.onnx", "tiny", seed=3).read_bytes()
    assert write_campplus_onnx(tmp_path / "e.onnx", "tiny", seed=3).read_bytes() == campplus


def test_full_preset_keeps_the_io(tmp_path, speech):
    prompt = CosyVoice2Frontend.from_model_dir(write_frontend_onnx(tmp_path, preset="full"))(speech[:32000])
    assert len(prompt.speech_tokens) == speech_token_count(32000) == 50
    assert prompt.speech_feat.shape == (100, 80) and prompt.spk_embedding.shape == (192,)


def test_unknown_preset_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        write_campplus_onnx(tmp_path / "x.onnx", "huge")


@pytest.mark.parametrize("num_samples", [1600, 1760, 16000, 16159, 16160, 48321])
def test_tokens_are_a_quarter_of_the_mel_frames(frontend, speech, num_samples):
    """Whisper mel frames are `samples // 160` (100 Hz); tokens are `ceil(frames / 4)` (25 Hz)."""
    tokens = frontend.tokenizer(speech[:num_samples])
    assert tokens.dtype == np.int32
    assert len(tokens) == speech_token_count(num_samples) == -(-(num_samples // 160) // 4)
    assert tokens.min() >= 0 and tokens.max() < CODEBOOK_SIZE


def test_tokens_depend_on_the_audio(frontend, speech):
    first, again = frontend.tokenizer(speech[:32000]), frontend.tokenizer(speech[:32000].copy())
    np.testing.assert_array_equal(first, again)
    other = frontend.tokenizer(speech[32000:64000])
    assert np.mean(first != other) > 0.3
    assert len(np.unique(frontend.tokenizer(speech))) > 10


def test_tokenizer_rejects_more_than_30_seconds_naming_the_field(frontend):
    wav = np.zeros(30 * 16000 + 160, dtype=np.float32)
    with pytest.raises(AudioError, match=r"reference_wav is 30\.0 s long; at most 30\.0 s"):
        frontend.tokenizer(wav)
    with pytest.raises(AudioError, match="reference_wav"):
        frontend(wav)


def test_wrong_shapes_are_errors_naming_what_was_expected(frontend):
    with pytest.raises(ValueError, match=r"log-mel \[128, T\], got \[80, 50\]"):
        frontend.tokenizer.tokens_from_mel(np.zeros((80, 50), dtype=np.float32))
    with pytest.raises(ValueError, match=r"fbank \[T, 80\], got \[50, 128\]"):
        frontend.speaker.embed_fbank(np.zeros((50, 128), dtype=np.float32))


def test_a_model_of_the_wrong_kind_is_refused(model_dir):
    with pytest.raises(CheckpointError, match="has 1 inputs; the speech tokenizer takes 2"):
        SpeechTokenizer(model_dir / "campplus.onnx")
    with pytest.raises(CheckpointError, match="ONNX model not found"):
        SpeakerEmbedder(model_dir / "missing.onnx")


def test_cuda_is_refused_clearly_when_onnxruntime_has_no_cuda(model_dir):
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(ValueError, match="no CUDAExecutionProvider"):
        create_session(model_dir / "campplus.onnx", device="cuda")
    with pytest.raises(ValueError, match="device must be"):
        create_session(model_dir / "campplus.onnx", device="tpu")


def test_embedding_is_192_finite_floats_that_depend_on_the_speaker(frontend, speech):
    embedding = frontend.speaker(speech[:48000])
    assert embedding.shape == (192,) and embedding.dtype == np.float32
    assert np.all(np.isfinite(embedding))
    assert not np.allclose(embedding, frontend.speaker(speech[48000:96000] * 0.5 + speech[:48000] * 0.1))


def test_prompt_feat_is_80_bins_at_50_hz_of_24khz_audio():
    for num_samples in (2400, 24000, 24479, 24480):
        feat = prompt_speech_feat(
            np.random.default_rng(0).standard_normal(num_samples).astype(np.float32) * 0.1
        )
        assert feat.shape == (num_samples // 480, 80) and feat.dtype == np.float32


def test_alignment_keeps_two_mel_frames_per_token():
    tokens, feat = np.arange(10), np.zeros((25, 80))
    kept_tokens, kept_feat = align_prompt_lengths(tokens, feat)
    assert len(kept_tokens) == 10 and len(kept_feat) == 20
    kept_tokens, kept_feat = align_prompt_lengths(tokens, feat[:17])
    assert len(kept_tokens) == 8 and len(kept_feat) == 16
    np.testing.assert_array_equal(kept_tokens, tokens[:8])


def test_frontend_returns_aligned_prompt_features(frontend, speech):
    prompt = frontend(speech)
    tokens, feat = prompt.speech_tokens, prompt.speech_feat
    samples_24k = -(-len(speech) * 3 // 2)
    expected = min(samples_24k // 480 // 2, speech_token_count(len(speech)))
    assert len(tokens) == expected and feat.shape == (2 * expected, 80)
    np.testing.assert_array_equal(tokens, frontend.tokenizer(speech)[:expected])
    np.testing.assert_allclose(prompt.spk_embedding, frontend.speaker(speech), rtol=1e-6)
    assert np.all(np.isfinite(feat))


def test_sessions_are_created_once(model_dir, speech, monkeypatch):
    created = []
    original = ort.InferenceSession

    def counting(*args, **kwargs):
        created.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting)
    frontend = CosyVoice2Frontend.from_model_dir(model_dir)
    frontend(speech[:16000])
    frontend(speech[16000:32000])
    assert len(created) == 2


@pytest.mark.parametrize(
    ("wav", "problem"),
    [
        (np.zeros(0, dtype=np.float32), "reference_wav is empty"),
        (np.full(16000, np.nan, dtype=np.float32), "reference_wav contains NaN"),
        (np.zeros(31 * 16000, dtype=np.float32), "reference_wav is 31.0 s long"),
        (np.zeros((2, 16000), dtype=np.float32), "reference_wav must be mono"),
        (np.zeros(16000, dtype=np.int16), "reference_wav must be float"),
    ],
)
def test_bad_audio_is_an_error_naming_the_field(frontend, wav, problem):
    with pytest.raises(AudioError, match=problem):
        frontend(wav)
