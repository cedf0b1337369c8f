"""The official-size synthetic checkpoint loads through the same strict loaders (about 4 GB on disk)."""

import numpy as np
import pytest

from tritontts.spark.codec import SparkCodec
from tritontts.spark.layout import missing_files
from tritontts.synthetic.spark import write_spark_checkpoint

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark_full_dir(tmp_path_factory):
    return write_spark_checkpoint(tmp_path_factory.mktemp("spark_full"), preset="full", seed=0)


def test_full_checkpoint_loads_and_tokenizes(spark_full_dir):
    assert missing_files(spark_full_dir) == []
    codec = SparkCodec(spark_full_dir, device="cpu")
    assert codec.wav2vec2.config.hidden_size == 1024 and codec.wav2vec2.config.num_hidden_layers == 24
    t = np.arange(16000, dtype=np.float32) / 16000
    (voice,) = codec.tokenize([0.3 * np.sin(2 * np.pi * 220 * t)])
    assert voice.global_tokens.shape == (32,) and voice.semantic_tokens.shape == (49,)
    (audio,) = codec.detokenize([voice.global_tokens], [voice.semantic_tokens])
    assert audio.shape == (49 * 320,) and np.all(np.isfinite(audio))


def test_full_llm_loads_strictly_into_the_engine(spark_full_dir, capsys):
    from tritontts.llm.check import main

    assert main(["--model_dir", str(spark_full_dir / "LLM")]) == 0
    assert "24 layers, hidden 896, vocab 166000" in capsys.readouterr().out
