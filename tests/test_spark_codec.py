"""The Spark-TTS audio side on a synthetic checkpoint in the official layout, on real speech."""

import subprocess

import numpy as np
import pytest
import soundfile
import torch

from tritontts.audio import AudioError, AudioLimits, load_wav
from tritontts.checkpoint import CheckpointError
from tritontts.spark.codec import SparkCodec
from tritontts.spark.layout import missing_files


@pytest.fixture(scope="module")
def codec(spark_tiny_dir) -> SparkCodec:
    return SparkCodec(spark_tiny_dir, device="cpu")


def test_tiny_checkpoint_has_the_official_layout(spark_tiny_dir):
    assert missing_files(spark_tiny_dir) == []


def test_tokenize_prompt_rates_and_round_trip(codec, prompt_zh):
    wav = load_wav(prompt_zh, 16000)
    (voice,) = codec.tokenize([wav])
    assert voice.global_tokens.shape == (32,)
    assert 0 <= voice.global_tokens.min() and voice.global_tokens.max() < 4096
    assert 0 <= voice.semantic_tokens.min() and voice.semantic_tokens.max() < 8192
    seconds = wav.size / 16000
    assert abs(voice.semantic_tokens.size - 50 * seconds) <= 1  # 320-sample hop, 400-sample receptive field
    (audio,) = codec.detokenize([voice.global_tokens], [voice.semantic_tokens])
    assert audio.shape == (voice.semantic_tokens.size * 320,)
    assert np.all(np.isfinite(audio)) and np.abs(audio).max() <= 1.0


def test_batched_equals_one_at_a_time(codec, prompt_zh):
    wav = load_wav(prompt_zh, 16000)
    wavs = [wav[:40000], wav, wav[16000:50000] * 0.3]
    batched = codec.tokenize(wavs)
    for w, voice in zip(wavs, batched):
        (alone,) = codec.tokenize([w])
        np.testing.assert_array_equal(voice.global_tokens, alone.global_tokens)
        np.testing.assert_array_equal(voice.semantic_tokens, alone.semantic_tokens)
    audios = codec.detokenize([v.global_tokens for v in batched], [v.semantic_tokens for v in batched])
    for voice, audio in zip(batched, audios):
        (alone,) = codec.detokenize([voice.global_tokens], [voice.semantic_tokens])
        np.testing.assert_allclose(audio, alone, atol=1e-4)


def test_references_padded_to_a_bucket_give_their_tokens_alone(spark_tiny_dir, codec, prompt_zh):
    bucketed = SparkCodec(spark_tiny_dir, device="cpu", reference_bucket=16000)
    wav = load_wav(prompt_zh, 16000)
    wavs = [wav[:40000], wav[:23456], wav[16000:50000] * 0.3]
    for w, voice in zip(wavs, bucketed.tokenize(wavs)):
        (alone,) = codec.tokenize([w])
        np.testing.assert_array_equal(voice.global_tokens, alone.global_tokens)
        np.testing.assert_array_equal(voice.semantic_tokens, alone.semantic_tokens)


def test_warming_tokenizes_each_bucket_length_once(spark_tiny_dir, codec, monkeypatch):
    assert codec.warm_tokenizer(2.5) == 0  # no buckets on the CPU by default
    bucketed = SparkCodec(spark_tiny_dir, device="cpu", reference_bucket=16000)
    seen = []
    tokenize = bucketed.tokenize
    monkeypatch.setattr(bucketed, "tokenize", lambda wavs: seen.append(len(wavs[0])) or tokenize(wavs))
    assert bucketed.warm_tokenizer(2.5) == 3
    assert seen == [16000, 32000, 48000]


def test_the_encoder_mask_keeps_the_padding_out(codec):
    encoder = codec.bicodec.encoder
    features = torch.randn(
        1, codec.bicodec.config.encoder.input_channels, 40, generator=torch.Generator().manual_seed(0)
    )
    padded = torch.nn.functional.pad(features, (0, 24))
    with torch.no_grad():
        alone = encoder(features)
        with codec.bicodec.encoder_mask.active(torch.tensor([40]), 64):
            masked = encoder(padded)
        unmasked = encoder(padded)
    torch.testing.assert_close(masked[..., :40], alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(unmasked[..., :40], alone, atol=1e-3)


def test_deterministic(codec, prompt_zh):
    wav = load_wav(prompt_zh, 16000)[:32000]
    first, second = codec.tokenize([wav]), codec.tokenize([wav])
    np.testing.assert_array_equal(first[0].semantic_tokens, second[0].semantic_tokens)


@pytest.mark.parametrize("rate", [8000, 48000])
def test_other_rates_are_resampled_to_16k(tmp_path, codec, prompt_zh, rate):
    native = load_wav(prompt_zh, 16000)
    path = tmp_path / f"p{rate}.wav"
    soundfile.write(path, load_wav(prompt_zh, rate), rate)
    loaded = load_wav(path, 16000)
    assert abs(loaded.size - native.size) <= 2
    (voice,) = codec.tokenize([loaded])
    assert abs(voice.semantic_tokens.size - (native.size - 400) // 320 - 1) <= 1


def test_stereo_takes_the_first_channel_as_upstream(tmp_path, prompt_zh):
    wav = load_wav(prompt_zh, 16000)
    path = tmp_path / "stereo.wav"
    soundfile.write(path, np.stack([wav, np.zeros_like(wav)], axis=1), 16000)
    np.testing.assert_allclose(load_wav(path, 16000), wav, atol=1e-4)


def test_short_audio_is_tiled_for_the_speaker_clip(codec, prompt_zh):
    wav = load_wav(prompt_zh, 16000)[16000:17600]  # 0.1 s
    (voice,) = codec.tokenize([wav])
    assert voice.global_tokens.shape == (32,) and voice.semantic_tokens.size == 4


@pytest.mark.parametrize(
    "samples, words",
    [
        (np.zeros(0, np.float32), "empty"),
        (np.full(16000, np.nan, np.float32), "NaN"),
        (np.zeros(800, np.float32), "at least"),
    ],
)
def test_bad_audio_is_rejected(tmp_path, samples, words):
    path = tmp_path / "bad.wav"
    soundfile.write(path, samples, 16000, subtype="FLOAT")
    with pytest.raises(AudioError, match=words):
        load_wav(path, 16000)


def test_sixty_seconds_is_over_the_limit(tmp_path, prompt_zh):
    long = np.tile(load_wav(prompt_zh, 16000), 7)[: 60 * 16000]
    path = tmp_path / "long.wav"
    soundfile.write(path, long, 16000)
    with pytest.raises(AudioError, match="at most 30"):
        load_wav(path, 16000)
    assert load_wav(path, 16000, AudioLimits(max_seconds=120)).size == 60 * 16000


def test_missing_weight_key_is_named(tmp_path, spark_tiny_dir):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "spark"
    subprocess.run(["cp", "-r", str(spark_tiny_dir), str(broken)], check=True)
    weights = broken / "BiCodec" / "model.safetensors"
    state = load_file(weights)
    key = sorted(state)[0]
    del state[key]
    save_file(state, weights)
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        SparkCodec(broken, device="cpu")
