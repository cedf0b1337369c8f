"""CausalMaskedDiffWithXvec: speech tokens + prompt (tokens, mel, speaker x-vector) → mel spectrogram."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.checkpoint import build_and_load
from tritontts.conv_gemm import pack_convs
from tritontts.cosyvoice2.config import CosyVoice2Config, FlowConfig, load_cosyvoice2_config
from tritontts.cosyvoice2.flow.cfm import CausalCFM
from tritontts.cosyvoice2.flow.encoder import UpsampleConformerEncoder
from tritontts.cosyvoice2.flow.encoder_graphs import BucketedEncoder
from tritontts.cosyvoice2.flow.estimator import Estimator
from tritontts.cosyvoice2.flow.graphs import GraphedCFM
from tritontts.cosyvoice2.flow.masks import valid_mask
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig
from tritontts.qkv import fuse_qkv

FLOW_FILE = "flow.pt"
VoiceDecoder = Callable[[Sequence[Any], Sequence[tuple[str, int]]], list[Tensor]]
"""(conditions, each call's voice key and prompt tokens) → what `Flow.decode(conditions)` gives"""
ENCODER_MEMORY_LIMIT_MIB = 512


class Flow(nn.Module):
    def __init__(self, config: FlowConfig):
        super().__init__()
        self.config = config
        self.token_mel_ratio = config.token_mel_ratio
        self.pre_lookahead_len = config.pre_lookahead_len
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        self.build_encoder(config)
        self.decoder = CausalCFM(config.cfm, self.build_estimator(config), config.output_size)
        self.graphed_decoder: GraphedCFM | None = None
        self.voice_decoder: VoiceDecoder | None = None
        self.encoder_graphs: BucketedEncoder | None = None

    def build_encoder(self, config: FlowConfig) -> None:
        """The modules `encode` uses, registered between the speaker layer and the decoder (state_dict order)."""
        self.encoder = UpsampleConformerEncoder(config.encoder, config.pre_lookahead_len)
        self.encoder_proj = nn.Linear(config.encoder.output_size, config.output_size)

    def build_estimator(self, config: FlowConfig) -> nn.Module:
        return Estimator(config.estimator)

    def use_cuda_graphs(self, config: FlowGraphConfig | None = None) -> CaptureReport:
        """Run the decoder's Euler loop (see `graphs.py`) and the encoder (`encoder_graphs.py`: the decoder's
        buckets in tokens) from CUDA graphs from now on; capture them now. Returns the decoder's report."""
        graphed = GraphedCFM(self.decoder, self.config.cfm.n_timesteps, config)
        report = graphed.capture()
        self.graphed_decoder = graphed
        self.encoder_graphs = self.bucketed_encoder(graphed.config)
        self.encoder_graphs.capture(ENCODER_MEMORY_LIMIT_MIB, graphed.config.streaming)
        return report

    def bucketed_encoder(self, config: FlowGraphConfig, **capture: Any) -> BucketedEncoder:
        weight = self.spk_embed_affine_layer.weight
        buckets = sorted({max(1, frames // self.token_mel_ratio) for frames in config.buckets})
        width = self.input_embedding.embedding_dim
        return BucketedEncoder(
            self.encode_padded, buckets, width, self.token_mel_ratio, weight.device, weight.dtype, **capture
        )

    @torch.inference_mode()
    def inference(
        self,
        token: Tensor,
        token_len: Tensor,
        prompt_token: Tensor,
        prompt_token_len: Tensor,
        prompt_feat: Tensor,
        prompt_feat_len: Tensor,
        embedding: Tensor,
        streaming: bool = False,
        finalize: bool = True,
    ) -> Tensor:
        """Generate the mel of `token`, continuing the prompt. Batch size 1.

        Args:
            token: int [1, T] speech token ids of the target (negative ids are clamped to 0).
            token_len: int [1], T.
            prompt_token: int [1, Tp] speech token ids of the prompt (Tp may be 0).
            prompt_token_len: int [1], Tp.
            prompt_feat: float [1, Tp * token_mel_ratio, 80] mel of the prompt audio (any float dtype).
            prompt_feat_len: int [1] (unused; the length is prompt_feat.shape[1]).
            embedding: float [1, spk_embed_dim] speaker x-vector (normalized here).
            streaming: use the chunked attention masks of the encoder and the estimator.
            finalize: the tokens end here. When False, the last `pre_lookahead_len` tokens are only
                lookahead context for the ones before them and get no mel of their own.

        Returns:
            float32 [1, 80, token_mel_ratio * (Tp + T) - prompt_feat.shape[1]] mel of the target, which is
            token_mel_ratio * T frames when finalize (token_mel_ratio * (T - pre_lookahead_len) if not)
            and the prompt mel matches the prompt tokens.
        """
        conditions = self.conditions(
            token, token_len, prompt_token, prompt_token_len, prompt_feat, embedding, streaming, finalize
        )
        return self.decode([conditions])[0]

    @torch.inference_mode()
    def inference_many(self, requests: Sequence[dict[str, Any]]) -> list[Tensor | ValueError]:
        """`inference(**request)` for each request, the decoder batched across them where a graph allows;
        a request whose inputs are refused gets its ValueError in its place. With a `voice_decoder` and a
        `voice` (key, prompt tokens) in every request, it decodes them (after each voice's prefix)."""
        conditions: list[FlowConditions | ValueError] = []
        voices = []
        for request in requests:
            request = {k: v for k, v in request.items() if k != "prompt_feat_len"}
            voice = request.pop("voice", None)
            try:
                conditions.append(self.conditions(**request))
                voices.append(voice)
            except ValueError as err:
                conditions.append(err)
        valid = [c for c in conditions if isinstance(c, FlowConditions)]
        if self.voice_decoder is not None and None not in voices:
            mels = iter(self.voice_decoder(valid, voices))
        else:
            mels = iter(self.decode(valid))
        return [c if isinstance(c, ValueError) else next(mels) for c in conditions]

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
        """Everything before the decoder: speaker, `encode`, the decoder's mu and prompt condition. When not
        `finalize`, the last `pre_lookahead_len` tokens are look-ahead only."""
        if token.size(0) != 1:
            raise ValueError(f"flow inference takes batch size 1, got {token.size(0)}")
        dtype = self.spk_embed_affine_layer.weight.dtype
        device = self.spk_embed_affine_layer.weight.device
        spks = self.spk_embed_affine_layer(F.normalize(embedding.to(device, dtype), dim=1))

        tokens = torch.cat([prompt_token, token], dim=1).to(device)
        tokens_len = (prompt_token_len + token_len).to(device)
        pad = valid_mask(tokens_len, tokens.size(1)).transpose(1, 2).to(dtype)
        x = self.input_embedding(torch.clamp(tokens, min=0)) * pad

        lookahead = 0 if finalize else self.pre_lookahead_len
        if x.size(1) <= lookahead:
            needed = (
                f"without finalize, more than {lookahead} tokens are needed" if lookahead else "no tokens"
            )
            raise ValueError(f"{needed}, got {x.size(1)}")
        out_tokens = x.size(1) - lookahead
        h = self.encoder_graphs(x, out_tokens, streaming) if self.encoder_graphs is not None else None
        if h is None:
            context = x[:, out_tokens:] if lookahead else None
            h = self.encode(x[:, :out_tokens], tokens_len, context, streaming)
        prompt_frames = prompt_feat.size(1)
        total_frames = h.size(1)
        if total_frames <= prompt_frames:
            raise ValueError(f"prompt mel ({prompt_frames} frames) leaves no frame for the target")
        mu = h.transpose(1, 2).contiguous()
        cond = torch.zeros(1, self.config.output_size, total_frames, device=device, dtype=dtype)
        cond[:, :, :prompt_frames] = prompt_feat.to(device, dtype).transpose(1, 2)
        return FlowConditions(mu, spks, cond, prompt_frames, streaming)

    def encode(self, x: Tensor, tokens_len: Tensor, context: Tensor | None, streaming: bool) -> Tensor:
        """Token embeddings `[1, N, input_size]` (+ `context`, the look-ahead tokens after them) → the decoder's
        mu, time first: `[1, token_mel_ratio * N, output_size]`."""
        h, _ = self.encoder(x, tokens_len, context=context, streaming=streaming)
        return self.encoder_proj(h)

    def encode_padded(self, x: Tensor, rows: Tensor, out_tokens: Tensor, streaming: bool) -> Tensor:
        """`encode` of a padded call (see `encoder_graphs.py`): x [1, L, input_size] holds the tokens and their
        look-ahead in its first `rows`; its first token_mel_ratio * out_tokens frames are `encode`'s."""
        return self.encoder_proj(self.encoder.forward_padded(x, rows, out_tokens, streaming))

    def decode(self, conditions: Sequence[FlowConditions]) -> list[Tensor]:
        """The decoder's mel of the target frames, float32 [1, 80, T - prompt_frames] per conditions; one
        batched graph call per group of calls that fit one, else one call each."""
        steps = self.config.cfm.n_timesteps
        mels: list[Tensor | None] = [None] * len(conditions)
        graphed = self.graphed_decoder
        for streaming in (False, True):
            group = [i for i, c in enumerate(conditions) if c.streaming == streaming]
            if graphed is not None and len(group) > 1:
                rows = [(conditions[i].mu, conditions[i].spks, conditions[i].cond) for i in group]
                for i, mel in zip(group, graphed.run_rows(rows, steps, streaming)):
                    mels[i] = mel
                continue
            for i in group:
                c = conditions[i]
                mask = torch.ones_like(c.mu[:, :1])
                mels[i] = (graphed or self.decoder)(c.mu, mask, c.spks, c.cond, steps, streaming=streaming)
        return [mel[:, :, c.prompt_frames :] for mel, c in zip(mels, conditions)]


@dataclass(frozen=True)
class FlowConditions:
    """One call's decoder inputs: mu and cond [1, 80, T], spks [1, 80]; the first prompt_frames are the prompt."""

    mu: Tensor
    spks: Tensor
    cond: Tensor
    prompt_frames: int
    streaming: bool


def flow_weights(model_dir_or_pt: str | Path) -> Path:
    """`flow.pt` in a model directory, or the file itself."""
    path = Path(model_dir_or_pt)
    return path / FLOW_FILE if path.is_dir() else path


def load_flow_module(
    build: Callable[[], nn.Module], weights: Path, device: str | torch.device, dtype: torch.dtype
) -> Any:
    """`build()` with `weights` loaded strictly (the decoder's fixed noise drawn), its attentions' q/k/v
    projections fused (tritontts.qkv), in `dtype`, its convolutions packed as GEMMs (tritontts.conv_gemm), in
    eval mode."""
    flow = build_and_load(build, weights, device, lambda f: f.decoder.reset_noise())
    fuse_qkv(flow)
    flow = flow.to(dtype=dtype).eval()
    pack_convs(flow)
    return flow


def load_flow(
    model_dir_or_pt: str | Path,
    config: FlowConfig | CosyVoice2Config | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Flow:
    """Load `flow.pt` (a plain state_dict) strictly into a Flow in eval mode.

    `model_dir_or_pt` is the model directory or the file; without `config`, `cosyvoice2.yaml` next to
    the weights is read.
    """
    weights = flow_weights(model_dir_or_pt)
    if isinstance(config, CosyVoice2Config):
        config = config.flow
    if config is None:
        config = load_cosyvoice2_config(weights.parent).flow
    return load_flow_module(lambda: Flow(config), weights, device, dtype)
