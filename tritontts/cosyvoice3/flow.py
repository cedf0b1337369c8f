"""CausalMaskedDiffWithDiT: speech tokens + prompt (tokens, mel, x-vector) → mel, with a DiT estimator.

CosyVoice2's `Flow` minus the conformer encoder: the token embeddings (80 wide) go through a pre-lookahead
layer (80 → 1024 → 80) and are repeated `token_mel_ratio` times to make the decoder's mu. The decoder is
CosyVoice2's `CausalCFM` around our `DiT`, so `decode`, `inference_many` and `use_cuda_graphs` (batched,
graphed Euler loops) are CosyVoice2's, inherited.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.checkpoint import build_and_load
from tritontts.cosyvoice2.flow.cfm import CausalCFM
from tritontts.cosyvoice2.flow.encoder import PreLookaheadLayer
from tritontts.cosyvoice2.flow.flow import Flow, FlowConditions
from tritontts.cosyvoice2.flow.graphs import GraphedCFM
from tritontts.cosyvoice2.flow.masks import valid_mask
from tritontts.cosyvoice3.config import CosyVoice3Config, Flow3Config, load_cosyvoice3_config
from tritontts.cosyvoice3.dit import DiT

FLOW_FILE = "flow.pt"


class Flow3(Flow):
    def __init__(self, config: Flow3Config) -> None:
        nn.Module.__init__(self)  # CosyVoice2's modules (encoder, encoder_proj) do not exist here
        self.config = config
        self.token_mel_ratio = config.token_mel_ratio
        self.pre_lookahead_len = config.pre_lookahead_len
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        self.pre_lookahead_layer = PreLookaheadLayer(
            config.input_size, config.pre_lookahead_len, hidden_channels=config.lookahead_channels
        )
        self.decoder = CausalCFM(config.cfm, DiT(config.estimator), config.output_size)  # type: ignore[arg-type]
        self.graphed_decoder: GraphedCFM | None = None

    def conditions(
        self,
        token: Tensor,
        token_len: Tensor,
        prompt_token: Tensor,
        prompt_token_len: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        streaming: bool = False,
        finalize: bool = True,
    ) -> FlowConditions:
        """The decoder's inputs. When not `finalize`, the last `pre_lookahead_len` tokens are look-ahead only."""
        if token.size(0) != 1:
            raise ValueError(f"flow inference takes batch size 1, got {token.size(0)}")
        dtype = self.spk_embed_affine_layer.weight.dtype
        device = self.spk_embed_affine_layer.weight.device
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(device, dtype), dim=1))

        tokens = torch.cat([prompt_token, token], dim=1).to(device)
        tokens_len = (prompt_token_len + token_len).to(device)
        pad = valid_mask(tokens_len, tokens.size(1)).transpose(1, 2).to(dtype)
        x = self.input_embedding(torch.clamp(tokens, min=0)) * pad
        if finalize:
            h = self.pre_lookahead_layer(x)
        else:
            lookahead = self.pre_lookahead_len
            if x.size(1) <= lookahead:
                raise ValueError(
                    f"without finalize, more than {lookahead} tokens are needed, got {x.size(1)}"
                )
            h = self.pre_lookahead_layer(x[:, :-lookahead], context=x[:, -lookahead:])
        h = h.repeat_interleave(self.token_mel_ratio, dim=1)
        prompt_frames, total_frames = prompt_feat.size(1), h.size(1)
        if total_frames <= prompt_frames:
            raise ValueError(f"prompt mel ({prompt_frames} frames) leaves no frame for the target")
        mu = h.transpose(1, 2).contiguous()
        cond = torch.zeros(1, self.config.output_size, total_frames, device=device, dtype=dtype)
        cond[:, :, :prompt_frames] = prompt_feat.to(device, dtype).transpose(1, 2)
        return FlowConditions(mu, spks, cond, prompt_frames, streaming)


def load_flow3(
    model_dir_or_pt: str | Path,
    config: Flow3Config | CosyVoice3Config | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Flow3:
    """Load `flow.pt` strictly into a Flow3 in eval mode; without `config`, `cosyvoice3.yaml` beside it is read."""
    path = Path(model_dir_or_pt)
    weights = path / FLOW_FILE if path.is_dir() else path
    if isinstance(config, CosyVoice3Config):
        config = config.flow
    if config is None:
        config = load_cosyvoice3_config(weights.parent).flow
    flow = build_and_load(lambda: Flow3(config), weights, device, lambda f: f.decoder.reset_noise())
    return flow.to(dtype=dtype).eval()
