"""A new CosyVoice2 voice asks the speech tokenizer and the speaker embedding at once, computing the prompt mel
meanwhile, and gives what the one-after-the-other computation gives."""

import threading

import numpy as np
import pytest

from tritontts.cosyvoice2.request import CosyVoice2Request
from tritontts.cosyvoice2.service import CosyVoice2Service, prompt_features

SECONDS = 2.0
WAV = np.random.default_rng(0).standard_normal(int(16000 * SECONDS)).astype(np.float32) * 0.1
TOKENS = np.arange(60, dtype=np.int32)  # more than the mel holds: the voice is cut to the mel
EMBEDDING = np.linspace(-1, 1, 192, dtype=np.float32)


def service(tokenize, embed) -> CosyVoice2Service:
    return CosyVoice2Service(
        prompter=None,
        tokenize=tokenize,
        embed=embed,
        generate=None,
        token2wav=None,
        default_voice=None,
        sampling=None,
    )


def test_tokenizer_and_embedding_run_at_once_and_match_the_sequential_voice():
    both_called = threading.Barrier(2, timeout=10)  # broken unless both calls are in flight together

    def tokenize(wav):
        both_called.wait()
        return TOKENS

    def embed(wav):
        both_called.wait()
        return EMBEDDING

    voice = service(tokenize, embed).voice(CosyVoice2Request(WAV, "ref", "target"))
    tokens, feat = prompt_features(WAV, TOKENS)
    assert voice.text == "ref"
    np.testing.assert_array_equal(voice.speech_tokens, tokens)
    assert voice.speech_tokens.dtype == np.int32 and len(tokens) == int(SECONDS * 25)
    np.testing.assert_array_equal(voice.speech_feat, feat)
    np.testing.assert_array_equal(voice.embedding, EMBEDDING)


def test_a_failing_front_end_call_fails_the_voice_and_the_service_goes_on():
    calls = {"n": 0}

    def tokenize(wav):
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("reference_wav: too short")
        return TOKENS

    frontend = service(tokenize, lambda wav: EMBEDDING)
    with pytest.raises(ValueError, match="reference_wav"):
        frontend.voice(CosyVoice2Request(WAV, "ref", "target"))
    assert frontend.voice(CosyVoice2Request(WAV, "ref", "target")).embedding.shape == (192,)


def test_onnx_front_ends_take_their_cpu_thread_count(tmp_path):
    from tritontts.cosyvoice2.frontend import SpeakerEmbedder, SpeechTokenizer, create_session
    from tritontts.synthetic.cosyvoice2_onnx import write_campplus_onnx, write_speech_tokenizer_onnx

    tokenizer_path = write_speech_tokenizer_onnx(tmp_path / "speech_tokenizer_v2.onnx")
    campplus_path = write_campplus_onnx(tmp_path / "campplus.onnx")
    one = SpeechTokenizer(tokenizer_path, "cpu")
    three = SpeechTokenizer(tokenizer_path, "cpu", threads=3)
    assert one.session.get_session_options().intra_op_num_threads == 1  # upstream's
    assert three.session.get_session_options().intra_op_num_threads == 3
    np.testing.assert_array_equal(one(WAV), three(WAV))
    embedder = SpeakerEmbedder(campplus_path, "cpu", threads=2)
    assert embedder.session.get_session_options().intra_op_num_threads == 2
    with pytest.raises(ValueError, match="threads must be at least 1"):
        create_session(campplus_path, "cpu", threads=0)
