"""Step-Audio-2-mini's DiT token2wav (flow + HiFT + prompt front end), loading the hub's `token2wav/` files."""

from tritontts.dit_token2wav.flow import FLOW_FILE, DiTFlow, FlowCache, load_dit_flow
from tritontts.dit_token2wav.speaker import DiTSpeaker
from tritontts.dit_token2wav.token2wav import DiTToken2Wav

__all__ = ["FLOW_FILE", "DiTFlow", "DiTSpeaker", "DiTToken2Wav", "FlowCache", "load_dit_flow"]
