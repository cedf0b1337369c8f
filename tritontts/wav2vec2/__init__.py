"""wav2vec2 encoder (XLSR-53 layout) used for Spark-TTS's semantic features."""

from tritontts.wav2vec2.config import Wav2Vec2Config
from tritontts.wav2vec2.features import normalize_and_pad
from tritontts.wav2vec2.model import SPARK_LAYERS, Wav2Vec2Encoder, checkpoint_to_encoder_keys, load_wav2vec2

__all__ = [
    "SPARK_LAYERS",
    "Wav2Vec2Config",
    "Wav2Vec2Encoder",
    "checkpoint_to_encoder_keys",
    "load_wav2vec2",
    "normalize_and_pad",
]
