"""CosyVoice3's front end: CosyVoice2's (whisper log-mel → speech tokenizer, CAMPPlus x-vector, 1:2 alignment)
with `speech_tokenizer_v3.onnx` and the prompt mel of `cosyvoice3.yaml`'s `feat_extractor` (fmax 12 kHz)."""

from __future__ import annotations

from pathlib import Path

from tritontts.cosyvoice2.frontend import CAMPPLUS_FILE, CosyVoice2Frontend, SpeakerEmbedder, SpeechTokenizer
from tritontts.cosyvoice3.config import load_cosyvoice3_config
from tritontts.dsp.matcha_mel import MatchaMelConfig

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v3.onnx"
PROMPT_MEL = MatchaMelConfig(fmax=12000.0)  # fmax None in the yaml: librosa's Nyquist


def cosyvoice3_frontend(
    model_dir: str | Path, tokenizer_device: str = "cpu", speaker_device: str = "cpu"
) -> CosyVoice2Frontend:
    model_dir = Path(model_dir)
    return CosyVoice2Frontend(
        SpeechTokenizer(model_dir / SPEECH_TOKENIZER_FILE, tokenizer_device),
        SpeakerEmbedder(model_dir / CAMPPLUS_FILE, speaker_device),
        load_cosyvoice3_config(model_dir).prompt_mel,
    )
