"""The Step-Audio-2 token2wav flow: speech tokens (+ prompt mel, speaker x-vector) → 80-bin mel at 50 Hz.

Whole-utterance `inference` over prompt + target tokens, or streaming: `setup_cache` runs the prompt
(with `pre_lookahead_len` look-ahead tokens after it) and keeps the encoder's and the estimator's caches;
each `inference_chunk` continues from a cache and returns the next one. `use_cuda_graphs` runs the decoder's
Euler loop from CUDA graphs (`graphs.py`). Module layout and parameter names are upstream's
CausalMaskedDiffWithXvec, so `flow.pt` loads strictly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tritontts.checkpoint import build_and_load
from tritontts.conv_gemm import pack_convs
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig
from tritontts.dit_token2wav.cfm import DiTCFM, EstimatorCache, KeyWindow
from tritontts.dit_token2wav.config import DiTFlowConfig, load_dit_flow_config
from tritontts.dit_token2wav.dit import DiT
from tritontts.dit_token2wav.encoder import EncoderCache, UpsampleConformerEncoderV2
from tritontts.dit_token2wav.graphs import FlowRow, GraphedDiTCFM
from tritontts.qkv import fuse_qkv

FLOW_FILE = "flow.pt"
T = TypeVar("T")


@dataclass(frozen=True)
class FlowCache:
    """Everything a chunk continues from; tensors are never written in place, so a cache can be shared."""

    encoder: EncoderCache
    estimator: EstimatorCache

    def trimmed(self, head: int, tail: int) -> FlowCache:
        """The estimator's keys cut to `head` + `tail` frames (see EstimatorCache.trimmed)."""
        return FlowCache(self.encoder, self.estimator.trimmed(head, tail))


def unwrap(result: T | Exception) -> T:
    """A result of the batched calls (`inference_many` and its like), or the exception it holds, raised."""
    if isinstance(result, Exception):
        raise result
    return result


@dataclass(frozen=True)
class FlowUtterance:
    """One whole utterance: tokens int [1, N] (prompt then target), the prompt's mel [1, F, 80], the speaker
    x-vector [1, spk_embed_dim] and the flow's start [1, 80, 2N] (None: the fixed noise)."""

    tokens: Tensor
    prompt_feat: Tensor
    embedding: Tensor
    noise: Tensor | None = None


@dataclass(frozen=True)
class FlowChunk:
    """One streamed chunk: tokens int [1, T] (the last `pre_lookahead_len` look-ahead unless `last_chunk`),
    the speaker x-vector [1, spk_embed_dim], the cache it continues and the estimator key frames the cache
    after it keeps (`KeyWindow`; None: all)."""

    tokens: Tensor
    embedding: Tensor
    cache: FlowCache
    last_chunk: bool = False
    keep: KeyWindow | None = None


class DiTFlow(nn.Module):
    def __init__(self, config: DiTFlowConfig) -> None:
        super().__init__()
        self.config = config
        self.input_embedding = nn.Embedding(config.vocab_size, config.input_size)
        self.spk_embed_affine_layer = nn.Linear(config.spk_embed_dim, config.output_size)
        self.encoder = UpsampleConformerEncoderV2(config.encoder, config.pre_lookahead_len)
        self.encoder_proj = nn.Linear(config.encoder.output_size, config.output_size)
        self.decoder = DiTCFM(DiT(config.estimator), config.inference_cfg_rate)
        self.graphed_decoder: GraphedDiTCFM | None = None

    def use_cuda_graphs(self, config: FlowGraphConfig | None = None) -> CaptureReport:
        """Run the decoder's Euler loop from CUDA graphs from now on (see `graphs.py`); capture them now.
        A plain FlowGraphConfig gets `DiTFlowGraphConfig`'s chunk and cache buckets."""
        graphed = GraphedDiTCFM(self.decoder, self.config.n_timesteps, config)
        report = graphed.capture()
        self.graphed_decoder = graphed
        return report

    @property
    def dtype(self) -> torch.dtype:
        return self.encoder_proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.encoder_proj.weight.device

    def _speaker(self, embedding: Tensor) -> Tensor:
        return self.spk_embed_affine_layer(F.normalize(embedding.to(self.device, self.dtype), dim=1))

    def _tokens(self, tokens: Tensor) -> Tensor:
        if tokens.dim() != 2 or tokens.size(0) != 1:
            raise ValueError(f"tokens must be [1, n] (batch 1), got {tuple(tokens.shape)}")
        return tokens.to(self.device, torch.long)

    @torch.inference_mode()
    def inference(
        self,
        tokens: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        n_timesteps: int | None = None,
        noise: Tensor | None = None,
    ) -> Tensor:
        """The mel of prompt + target in one pass (full attention everywhere).

        Args:
            tokens: int [1, N], the prompt's speech tokens then the target's (negative ids read as 0).
            prompt_feat: float [1, F, 80], the prompt's mel, F <= token_mel_ratio * N; it conditions the
                first F frames.
            embedding: float [1, spk_embed_dim], the speaker x-vector (normalized here).
            noise: float [1, 80, token_mel_ratio * N], the flow's start, or None for the fixed noise.

        Returns:
            float32 [1, 80, token_mel_ratio * N]; the target's mel is what follows the first F frames.
        """
        return unwrap(
            self.inference_many([FlowUtterance(tokens, prompt_feat, embedding, noise)], n_timesteps)[0]
        )

    def _encode_utterance(self, utterance: FlowUtterance) -> FlowRow:
        tokens = self._tokens(utterance.tokens)
        spks = self._speaker(utterance.embedding)
        x = self.input_embedding(torch.clamp(tokens, min=0))
        h, _ = self.encoder(x, torch.tensor([tokens.size(1)], device=self.device))
        mu = self.encoder_proj(h).transpose(1, 2).contiguous()
        frames = utterance.prompt_feat.size(1)
        if frames > mu.size(2):
            raise ValueError(f"prompt mel has {frames} frames, more than the {mu.size(2)} of the tokens")
        cond = torch.zeros_like(mu)
        cond[:, :, :frames] = utterance.prompt_feat.to(self.device, self.dtype).transpose(1, 2)
        return FlowRow(mu, spks, cond, noise=utterance.noise)

    @torch.inference_mode()
    def inference_many(
        self, utterances: Sequence[FlowUtterance], n_timesteps: int | None = None
    ) -> list[Tensor | ValueError]:
        """`inference` of each utterance (or the ValueError its inputs raise), their decoders batched where a
        graph allows (`use_cuda_graphs` with batch sizes above 1)."""
        steps = n_timesteps or self.config.n_timesteps
        encoded: list[FlowRow | ValueError] = []
        for utterance in utterances:
            try:
                encoded.append(self._encode_utterance(utterance))
            except ValueError as err:
                encoded.append(err)
        rows = [row for row in encoded if isinstance(row, FlowRow)]
        if self.graphed_decoder is not None:
            mels = iter([mel for mel, _ in self.graphed_decoder.run(rows, steps, streaming=False)])
        else:
            mels = iter([self.decoder(r.mu, r.spks, r.cond, steps, r.noise) for r in rows])
        return [row if isinstance(row, ValueError) else next(mels).float() for row in encoded]

    def _encode_chunk(
        self,
        tokens: Tensor,
        spks: Tensor,
        cond: Tensor | None,
        last_chunk: bool,
        cache: FlowCache | None,
        keep: KeyWindow | None = None,
    ) -> tuple[FlowRow, EncoderCache]:
        x = self.input_embedding(tokens)
        h, encoder_cache = self.encoder.forward_chunk(x, last_chunk, None if cache is None else cache.encoder)
        mu = self.encoder_proj(h).transpose(1, 2).contiguous()
        cond = torch.zeros_like(mu) if cond is None else cond
        estimator = None if cache is None else cache.estimator
        return FlowRow(mu, spks, cond, estimator, keep=keep), encoder_cache

    def _decode_chunks(
        self, rows: Sequence[FlowRow], n_timesteps: int
    ) -> list[tuple[Tensor, EstimatorCache]]:
        """Each row's (mel, estimator cache after it): one batched graphed run, or the plain decoder row by row."""
        if self.graphed_decoder is not None:
            return self.graphed_decoder.run(rows, n_timesteps, streaming=True)
        return [self.decoder.forward_chunk(r.mu, r.spks, r.cond, n_timesteps, r.cache, r.keep) for r in rows]

    def _chunk(
        self,
        tokens: Tensor,
        spks: Tensor,
        cond: Tensor | None,
        last_chunk: bool,
        cache: FlowCache | None,
        n_timesteps: int,
    ) -> tuple[Tensor, FlowCache]:
        row, encoder_cache = self._encode_chunk(tokens, spks, cond, last_chunk, cache)
        feat, estimator_cache = self._decode_chunks([row], n_timesteps)[0]
        return feat, FlowCache(encoder_cache, estimator_cache)

    @torch.inference_mode()
    def setup_cache(
        self, tokens: Tensor, mel: Tensor, embedding: Tensor, n_timesteps: int | None = None
    ) -> FlowCache:
        """The caches after the prompt.

        Args:
            tokens: int [1, n + pre_lookahead_len], the prompt's tokens then look-ahead tokens.
            mel: float [1, token_mel_ratio * n, 80], the prompt's mel (the estimator's condition).
            embedding: float [1, spk_embed_dim].
        """
        tokens = self._tokens(tokens)
        frames = (tokens.size(1) - self.config.pre_lookahead_len) * self.config.token_mel_ratio
        if mel.dim() != 3 or mel.size(1) != frames:
            raise ValueError(
                f"setup_cache: {tokens.size(1)} tokens (with {self.config.pre_lookahead_len} look-ahead) "
                f"need a prompt mel of {frames} frames, got shape {tuple(mel.shape)}"
            )
        cond = mel.to(self.device, self.dtype).transpose(1, 2).contiguous()
        steps = n_timesteps or self.config.n_timesteps
        _, cache = self._chunk(tokens, self._speaker(embedding), cond, False, None, steps)
        return cache

    @torch.inference_mode()
    def inference_chunk(
        self,
        tokens: Tensor,
        embedding: Tensor,
        cache: FlowCache,
        last_chunk: bool = False,
        n_timesteps: int | None = None,
    ) -> tuple[Tensor, FlowCache]:
        """The mel of the next chunk and the cache after it.

        Args:
            tokens: int [1, T]; the last `pre_lookahead_len` are look-ahead only (the next chunk starts with
                them again) unless `last_chunk`, when all T get frames.
        Returns:
            (float32 [1, 80, token_mel_ratio * T'], FlowCache), T' = T - pre_lookahead_len or T.
        """
        return self.inference_chunks([FlowChunk(tokens, embedding, cache, last_chunk)], n_timesteps)[0]

    @torch.inference_mode()
    def inference_chunks(
        self, chunks: Sequence[FlowChunk], n_timesteps: int | None = None
    ) -> list[tuple[Tensor, FlowCache]]:
        """`inference_chunk` of each chunk (of different streams), their decoders batched where a graph
        allows (`use_cuda_graphs` with batch sizes above 1)."""
        steps = n_timesteps or self.config.n_timesteps
        encoded = [
            self._encode_chunk(
                self._tokens(c.tokens), self._speaker(c.embedding), None, c.last_chunk, c.cache, c.keep
            )
            for c in chunks
        ]
        decoded = self._decode_chunks([row for row, _ in encoded], steps)
        return [
            (feat.float(), FlowCache(encoder_cache, estimator_cache))
            for (_, encoder_cache), (feat, estimator_cache) in zip(encoded, decoded)
        ]


def load_dit_flow(
    model_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    config: DiTFlowConfig | None = None,
) -> DiTFlow:
    """`flow.yaml` and `flow.pt` from a token2wav directory, loaded strictly, the attentions' q/k/v projections
    fused (tritontts.qkv), its convolutions packed as GEMMs (tritontts.conv_gemm); eval mode, in `dtype`."""
    model_dir = Path(model_dir)
    config = config or load_dit_flow_config(model_dir)
    flow = build_and_load(
        lambda: DiTFlow(config), model_dir / FLOW_FILE, device, lambda f: f.decoder.reset_noise()
    )
    fuse_qkv(flow)
    flow = flow.to(dtype=dtype).eval()
    pack_convs(flow)
    return flow
