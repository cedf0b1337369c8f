"""A tiny synthetic HiFT whose source is a constant, for tests that compare audio through it."""

from __future__ import annotations

from tritontts.checkpoint import load_strict
from tritontts.cosyvoice2.hift import HiFT, fuse_weight_norm
from tritontts.synthetic.cosyvoice2_hift import preset_config, random_state_dict


def constant_source_hift() -> HiFT:
    """The seed-0 tiny weights with the source merge zeroed: the excitation is tanh(0.3) everywhere. Two calls
    then vocode with the same source however their f0 differs, so a mel difference reaches the audio as it is
    (a sine source integrates an f0 difference into its phase) and a stream's pieces equal one pass."""
    state = random_state_dict("tiny", 0)
    state["m_source.l_linear.weight"].zero_()
    state["m_source.l_linear.bias"].fill_(0.3)
    model = HiFT(preset_config("tiny"))
    load_strict(model, state)
    fuse_weight_norm(model)
    return model.eval()
