"""CosyVoice2-DiT in one process: CosyVoice2's LLM with Step-Audio-2-mini's DiT token2wav, batch by batch.

`--model-dir` holds `CosyVoice2-0.5B/` (its 25 Hz speech tokenizer makes the LLM prompt), `cosyvoice2_llm/` and
`Step-Audio-2-mini/token2wav/`, as upstream's run script lays them out. The front-end stage gives each reference
the speech tokens of the LLM prompt (uncut, as upstream's DiT BLS sends them) and the DiT speaker (its own
tokens, mel and x-vector, cut to each other, and the flow's caches after the prompt); both are kept per distinct
reference (a few at a time) and forgotten after the warm-up. Token2wav runs `offline()` one row at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_cosyvoice2 import (
    CosyVoice2Pipeline,
    frontend_device,
    llm_side,
    require_folders,
)
from tritontts.bench.offline_settings import OfflineSettings
from tritontts.cosyvoice2.frontend import INPUT_SAMPLE_RATE, SPEECH_TOKENIZER_FILE, SpeechTokenizer
from tritontts.cosyvoice2.layout import LLM_DIR, MODEL_DIR
from tritontts.devices import resolve_flow_dtype
from tritontts.dit_token2wav.layout import TOKEN2WAV_DIR
from tritontts.dit_token2wav.speaker import DiTSpeaker
from tritontts.dit_token2wav.token2wav import SPEAKER_CACHE_SIZE, DiTToken2Wav
from tritontts.voice_cache import VoiceCache, audio_key

VOICE_KEY = "cosyvoice2_dit"
FRONTEND_NOTE = (
    "frontend_s: CosyVoice2-0.5B's speech tokens of the reference (the LLM prompt's, uncut) and the DiT "
    "token2wav's speaker (its own tokens, mel, x-vector and the flow's prompt caches), once per distinct "
    f"reference (the last {SPEAKER_CACHE_SIZE} are kept; the warm-up's are forgotten before the measured pass)"
)


@dataclass(frozen=True)
class DiTVoice:
    speech_tokens: np.ndarray
    """int32 [n], CosyVoice2-0.5B's tokens of the whole reference (the LLM prompt's)"""
    speaker: DiTSpeaker


class DiTToken2WavStrategy:
    """The LLM prompt's tokens from CosyVoice2's tokenizer, the audio from the DiT token2wav."""

    def __init__(
        self, tokenizer: SpeechTokenizer, token2wav: DiTToken2Wav, cache_size: int = SPEAKER_CACHE_SIZE
    ) -> None:
        self.tokenizer = tokenizer
        self.token2wav = token2wav
        self.cache_size = cache_size
        self.voices: VoiceCache[DiTVoice] = VoiceCache(cache_size)

    def voice(self, wav_16k: np.ndarray) -> DiTVoice:
        def compute() -> DiTVoice:
            tokens = np.asarray(self.tokenizer(wav_16k), dtype=np.int32)
            return DiTVoice(tokens, self.token2wav.prepare_speaker(wav_16k))

        voice, _ = self.voices.get_or_compute(audio_key(wav_16k, INPUT_SAMPLE_RATE, VOICE_KEY), compute)
        return voice

    def vocode(self, tokens: list[int], voice: DiTVoice) -> np.ndarray:
        return self.token2wav.offline(tokens, voice.speaker)

    def forget_voices(self) -> None:
        self.voices = VoiceCache(self.cache_size)


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[CosyVoice2Pipeline, int, dict]:
    """The pipeline, the rate its reference audio is read at, and what the report says about its dtypes."""
    root = Path(settings.model_dir)
    require_folders(
        root,
        (MODEL_DIR, LLM_DIR, TOKEN2WAV_DIR),
        "scripts/download_model.py --model cosyvoice2_dit writes all three",
    )
    llm = llm_side(settings, rows, device)
    flow_dtype = resolve_flow_dtype(settings.token2wav_dtype, device)
    tokenizer = SpeechTokenizer(root / MODEL_DIR / SPEECH_TOKENIZER_FILE, frontend_device(device))
    # The strategy keeps the speakers itself, so that the warm-up's can be forgotten.
    dit = DiTToken2Wav.from_model_dir(
        root / TOKEN2WAV_DIR, device, flow_dtype, seed=settings.seed, speaker_cache_size=0
    )
    extra = {
        "token2wav_dtype": str(flow_dtype).removeprefix("torch."),
        "hift_dtype": "float32",
        "frontend_note": FRONTEND_NOTE,
    }
    pipeline = CosyVoice2Pipeline(
        llm.prompter, llm.generate, DiTToken2WavStrategy(tokenizer, dit), device, llm.max_seq_len
    )
    return pipeline, INPUT_SAMPLE_RATE, {**llm.report, **extra}
