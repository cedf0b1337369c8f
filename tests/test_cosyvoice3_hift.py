"""CosyVoice3 causal HiFT: strict hift.pt loading, the replayed source noise, and parity with upstream (tiny).

Golden data: see tests/test_cosyvoice3_flow.py. Checked in parts as for CosyVoice2's HiFT (f0, the source made
from upstream's f0, the audio decoded from upstream's source), then whole calls, final and non-final.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tolerance import max_error, within

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.hift import HIFT_FILE
from tritontts.cosyvoice3.hift import CausalHiFT, load_causal_hift
from tritontts.cosyvoice3.noise import source_noise
from tritontts.synthetic.cosyvoice3 import preset_config, write_cosyvoice3_token2wav

DATA = Path(__file__).parent / "data"
GOLDEN = np.load(DATA / "cosyvoice3_golden.npz")
NOISE_FAR = 2_000_000  # where cosyvoice3_make_golden.py took its second noise slice
# Bounds: about 4x the largest error `python tests/golden_spread.py tests/test_cosyvoice3_hift.py` measured over
# ATen native(avx512)/avx2/default with oneDNN/MKL to match, 1 and 2 threads, on this 2-core Xeon.
F0_BOUND = 2.5e-4  # Hz of ~150 Hz, f0 in float64: measured 0 .. 6.1e-5 (4.1x)
SOURCE_BOUND = 6e-5  # from upstream's f0: measured 0 on every path
DECODE_BOUND = 8e-6  # from upstream's mel and source: measured 7.1e-7 .. 1.8e-6 (4.4x)
# End to end, a 1-ulp f0 difference is integrated into the source phase over the whole call: measured
# 7.1e-7 .. 3.1e-4 (the default kernel path), so the whole call is checked loosely, the parts tightly.
SPEECH_BOUND = 1.3e-3

pytestmark = [pytest.mark.golden, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cosyvoice3_token2wav(tmp_path_factory.mktemp("cosy3_hift"), "tiny", seed=0)


@pytest.fixture(scope="module")
def hift(model_dir: Path) -> CausalHiFT:
    torch.manual_seed(4321)  # the source noise must not depend on the global RNG
    return load_causal_hift(model_dir, max_seconds=5)


def _mel() -> torch.Tensor:
    return torch.from_numpy(GOLDEN["flow_offline"])[None, :, :40].contiguous()


def test_full_preset_has_upstreams_keys_shapes_and_order() -> None:
    import json

    keys = json.loads((DATA / "cosyvoice3_keys.json").read_text())["hift"]
    with torch.device("meta"):
        ours = [[k, list(v.shape)] for k, v in CausalHiFT(preset_config("full").hift).state_dict().items()]
    assert ours == keys


def test_source_noise_replays_upstreams_draws() -> None:
    config = preset_config("tiny")
    head = source_noise(config.flow, config.hift, NOISE_FAR + 1200)
    assert torch.equal(head[0, :1200], torch.from_numpy(GOLDEN["source_noise_head"]))
    assert torch.equal(head[0, NOISE_FAR:], torch.from_numpy(GOLDEN["source_noise_far"]))


def test_source_noise_depends_on_the_flow_sizes() -> None:
    """The draw follows the parameters upstream initialises before it: another flow width moves it."""
    config = preset_config("full")
    other = source_noise(config.flow, config.hift, 1200)
    assert not torch.equal(other[0], torch.from_numpy(GOLDEN["source_noise_head"]))


def test_strict_loading_names_an_unexpected_key(model_dir: Path, tmp_path: Path) -> None:
    state = torch.load(model_dir / HIFT_FILE, weights_only=True)
    state["m_source.l_sin_gen.extra"] = torch.zeros(1)
    torch.save(state, tmp_path / HIFT_FILE)
    (tmp_path / "cosyvoice3.yaml").write_text((model_dir / "cosyvoice3.yaml").read_text())
    with pytest.raises(CheckpointError, match="unexpected keys: m_source.l_sin_gen.extra"):
        load_causal_hift(tmp_path, max_seconds=1)


@pytest.mark.parametrize("finalize", [True, False])
def test_parts_match_upstream(hift: CausalHiFT, finalize: bool) -> None:
    tag = "final" if finalize else "partial"
    mel = _mel()
    with torch.inference_mode():
        f0 = hift.f0(mel, finalize)
        within(f"f0 {tag}", max_error(f0[0], GOLDEN[f"hift_f0_{tag}"]), F0_BOUND)
        upstream_f0 = torch.from_numpy(GOLDEN[f"hift_f0_{tag}"])[None]
        source = hift.m_source(upstream_f0)
        within(f"source {tag}", max_error(source[0, 0], GOLDEN[f"hift_source_{tag}"]), SOURCE_BOUND)
        upstream_source = torch.from_numpy(GOLDEN[f"hift_source_{tag}"])[None, None]
        feat = mel if finalize else mel[:, :, :-3]
        audio = hift.decode(feat, upstream_source, finalize)
        within(f"decode {tag}", max_error(audio[0], GOLDEN[f"hift_decode_{tag}"]), DECODE_BOUND)


@pytest.mark.parametrize("finalize", [True, False])
def test_speech_matches_upstream(hift: CausalHiFT, finalize: bool) -> None:
    tag = "final" if finalize else "partial"
    audio, _ = hift.inference(_mel(), finalize)
    assert audio.shape[-1] == 480 * (40 if finalize else 40 - 8)
    within(f"speech {tag}", max_error(audio[0], GOLDEN[f"hift_speech_{tag}"]), SPEECH_BOUND)


def test_a_non_final_call_is_a_prefix_of_the_final_one(hift: CausalHiFT) -> None:
    """What the stateless Triton vocoder relies on: re-vocoding more mel never changes audio already sent."""
    mel = _mel()
    final, _ = hift.inference(mel, finalize=True)
    for frames in (16, 25, 33):
        partial, _ = hift.inference(mel[:, :, :frames].contiguous(), finalize=False)
        assert partial.shape[-1] == 480 * (frames - 8)
        assert max_error(partial[0], final[0, : partial.shape[-1]]) < 1e-5


def test_too_long_a_mel_for_the_loaded_noise_is_refused(hift: CausalHiFT) -> None:
    with pytest.raises(ValueError, match="noise samples"):
        hift.inference(torch.zeros(1, 80, 5 * 50 + 1))


@pytest.mark.parametrize(
    ("name", "part"), [("conv_post.bias", "decode"), ("m_source.l_linear.bias", "speech")]
)
def test_a_changed_weight_breaks_the_bound(model_dir: Path, name: str, part: str) -> None:
    changed = load_causal_hift(model_dir, max_seconds=5)
    with torch.no_grad():
        dict(changed.named_parameters())[name].view(-1)[0] += 1e-3
    mel = _mel()
    with torch.inference_mode():
        if part == "decode":
            source = torch.from_numpy(GOLDEN["hift_source_final"])[None, None]
            assert max_error(changed.decode(mel, source)[0], GOLDEN["hift_decode_final"]) > DECODE_BOUND
        else:
            assert max_error(changed.inference(mel, True)[0][0], GOLDEN["hift_speech_final"]) > SPEECH_BOUND
