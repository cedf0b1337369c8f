"""CosyVoice2 flow: speech tokens → mel (CausalMaskedDiffWithXvec, state_dict-exact with `flow.pt`)."""

from tritontts.cosyvoice2.flow.flow import FLOW_FILE, Flow, load_flow

__all__ = ["FLOW_FILE", "Flow", "load_flow"]
