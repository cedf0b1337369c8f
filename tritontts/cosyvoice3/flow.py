"""CausalMaskedDiffWithDiT: speech tokens + prompt (tokens, mel, x-vector) → mel, with a DiT estimator.

CosyVoice2's `Flow` minus the conformer encoder: the token embeddings (80 wide) go through a pre-lookahead
layer (80 → 1024 → 80) and are repeated `token_mel_ratio` times to make the decoder's mu. The decoder is
CosyVoice2's `CausalCFM` around our `DiT`. Flow3 gives CosyVoice2's `Flow` only those three parts
(`build_encoder`, `build_estimator`, `encode`, `encode_padded`); `conditions`, `decode`, `inference_many` and `use_cuda_graphs`
(batched, graphed Euler loops) and the strict loader are CosyVoice2's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from tritontts.cosyvoice2.flow.encoder import PreLookaheadLayer
from tritontts.cosyvoice2.flow.flow import FLOW_FILE, Flow, flow_weights, load_flow_module
from tritontts.cosyvoice3.config import CosyVoice3Config, Flow3Config, load_cosyvoice3_config
from tritontts.cosyvoice3.dit import DiT

__all__ = ["FLOW_FILE", "Flow3", "load_flow3"]


class Flow3(Flow):
    """CosyVoice2's Flow with the pre-lookahead layer for an encoder and the DiT for an estimator."""

    config: Flow3Config

    def build_encoder(self, config: Flow3Config) -> None:  # type: ignore[override]
        self.pre_lookahead_layer = PreLookaheadLayer(
            config.input_size, config.pre_lookahead_len, hidden_channels=config.lookahead_channels
        )

    def build_estimator(self, config: Flow3Config) -> nn.Module:  # type: ignore[override]
        return DiT(config.estimator)

    def encode(self, x: Tensor, tokens_len: Tensor, context: Tensor | None, streaming: bool) -> Tensor:
        """No encoder: the pre-lookahead layer (`streaming` changes nothing before the DiT), each token's row
        repeated `token_mel_ratio` times."""
        return self.pre_lookahead_layer(x, context=context).repeat_interleave(self.token_mel_ratio, dim=1)

    def encode_padded(self, x: Tensor, rows: Tensor, out_tokens: Tensor, streaming: bool) -> Tensor:
        """`encode` of a padded call: rows past `rows` are zero already (the embeddings are masked), and the
        pre-lookahead layer reads only its next tokens, so the padding reaches no frame before `out_tokens`."""
        return self.pre_lookahead_layer(x).repeat_interleave(self.token_mel_ratio, dim=1)


def load_flow3(
    model_dir_or_pt: str | Path,
    config: Flow3Config | CosyVoice3Config | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Flow3:
    """Load `flow.pt` strictly into a Flow3 in eval mode; without `config`, `cosyvoice3.yaml` beside it is read."""
    weights = flow_weights(model_dir_or_pt)
    if isinstance(config, CosyVoice3Config):
        config = config.flow
    if config is None:
        config = load_cosyvoice3_config(weights.parent).flow
    return load_flow_module(lambda: Flow3(config), weights, device, dtype)  # type: ignore[arg-type]
