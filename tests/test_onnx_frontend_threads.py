"""The CosyVoice2/3 ONNX front ends' CPU threads (run.sh --onnx_threads)."""

import numpy as np
import pytest

from tritontts.cosyvoice2.frontend import SpeakerEmbedder, SpeechTokenizer, create_session
from tritontts.synthetic.cosyvoice2_onnx import write_campplus_onnx, write_speech_tokenizer_onnx

SECONDS = 2.0
WAV = np.random.default_rng(0).standard_normal(int(16000 * SECONDS)).astype(np.float32) * 0.1


def test_onnx_front_ends_take_their_cpu_thread_count(tmp_path):
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
