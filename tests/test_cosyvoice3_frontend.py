"""CosyVoice3 front end: the prompt mel (fmax None = 12 kHz) against upstream's matcha mel_spectrogram, the v3
tokenizer file, and the synthetic checkpoint's cached speaker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tolerance import max_error, within

from tritontts.cosyvoice2.frontend import prompt_speech_feat
from tritontts.cosyvoice2.spk2info import DEFAULT_SPEAKER, load_spk2info
from tritontts.cosyvoice3.frontend import PROMPT_MEL, cosyvoice3_frontend
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR, missing_files
from tritontts.synthetic.cosyvoice2 import voiced_signal
from tritontts.synthetic.cosyvoice3 import preset_config
from tritontts.synthetic.cosyvoice3_checkpoint import is_complete, write_cosyvoice3_checkpoint

GOLDEN = np.load(Path(__file__).parent / "data" / "cosyvoice3_golden.npz")
MEL_BOUND = 2e-4  # log-mel of a 1.3 s tone in noise

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cosyvoice3_checkpoint(tmp_path_factory.mktemp("cosy3_ck"), "tiny", seed=0)


@pytest.mark.golden
def test_prompt_mel_matches_upstreams_matcha_mel() -> None:
    assert preset_config("tiny").prompt_mel == PROMPT_MEL
    feat = prompt_speech_feat(torch.from_numpy(GOLDEN["prompt_wav_24k"]), PROMPT_MEL)
    within("prompt mel", max_error(feat.T, GOLDEN["prompt_mel"]), MEL_BOUND)


def test_prompt_mel_differs_from_cosyvoice2s() -> None:
    wav = torch.from_numpy(GOLDEN["prompt_wav_24k"])
    assert max_error(prompt_speech_feat(wav), GOLDEN["prompt_mel"].T) > 0.1


def test_checkpoint_is_complete_and_its_speaker_is_the_front_ends(root: Path) -> None:
    assert not missing_files(root)
    assert is_complete(root, "tiny", 0) and not is_complete(root, "full", 0)
    speaker = load_spk2info(root / MODEL_DIR / "spk2info.pt")[DEFAULT_SPEAKER]
    features = cosyvoice3_frontend(root / MODEL_DIR)(voiced_signal(seed=0))
    assert np.array_equal(speaker.speech_token[0].numpy(), features.speech_tokens)
    assert np.allclose(speaker.speech_feat[0].numpy(), features.speech_feat)
    assert len(features.speech_feat) == 2 * len(features.speech_tokens)
    assert (root / LLM_DIR / "cosyvoice3_metadata.json").is_file()
