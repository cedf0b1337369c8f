"""The Qwen2 decoder with fused q/k/v and gate/up projections, reading and writing a static KV cache.

One forward serves prefill and decode: tokens `[B, L]` of the B consecutive cache `slots` at `positions
[B, L]` write their keys and values into each layer's `[slots, kv_heads, max_seq_len, head_dim]` buffers
and attend to the first `kv_len` cached positions that are not after their own. Writes index the whole
buffer (never a sliced view of it), so that torch.compile updates the cache in place.

A batched prefill right-pads its prompts and passes their `lengths [B]`: padding neither writes the cache
nor is attended to, and the logits are those of each row's last real position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tritontts.llm.config import Qwen2Config


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(
    config: Qwen2Config, max_positions: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[max_positions, head_dim]` in fp32, halves repeated as Qwen2's rotate-half RoPE wants."""
    dim = config.head_dim
    inv_freq = 1.0 / (
        config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim)
    )
    angles = torch.outer(torch.arange(max_positions, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out (softmax in fp32): for one query row per head, SDPA's fused kernels
    (cuDNN's, with a mask) were slower on an H100 than these two small matmuls."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


class Attention(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, config.hidden_size + 2 * config.kv_dim, bias=True)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slots: slice,
        kv_len: int,
        real: torch.Tensor | None,
    ) -> torch.Tensor:
        batch, length, _ = x.shape
        groups = self.heads // self.kv_heads
        q, k, v = self.qkv_proj(x).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1
        )
        q = apply_rope(q.view(batch, length, self.heads, self.head_dim), cos, sin)
        k = apply_rope(k.view(batch, length, self.kv_heads, self.head_dim), cos, sin)
        v = v.view(batch, length, self.kv_heads, self.head_dim)
        rows = torch.arange(slots.start, slots.stop, device=x.device).unsqueeze(1)
        if real is not None:  # padding rewrites what the cache already holds
            k = torch.where(real, k, k_cache[rows, :, positions])
            v = torch.where(real, v, v_cache[rows, :, positions])
        k_cache[rows, :, positions] = k
        v_cache[rows, :, positions] = v
        # Grouped-query attention without copying the cache: the query heads that share a KV head become
        # extra query rows of that head.
        q = q.view(batch, length, self.kv_heads, groups, self.head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(batch, self.kv_heads, groups * length, self.head_dim)
        out = attention(q, k_cache[slots, :, :kv_len], v_cache[slots, :, :kv_len], mask)
        out = out.view(batch, self.kv_heads, groups, length, self.head_dim).permute(0, 3, 1, 2, 4)
        return self.o_proj(out.reshape(batch, length, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, *attention_args) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), *attention_args)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen2ForCausalLM(nn.Module):
    """Parameter names follow Hugging Face's, except `qkv_proj` and `gate_up_proj`, which the loader fuses."""

    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )
        self.rope_cos: torch.Tensor | None = None
        self.rope_sin: torch.Tensor | None = None

    def init_rope(self, max_positions: int) -> None:
        """Tables only grow, so a shorter runner of the same model can share them."""
        if self.rope_cos is None or self.rope_cos.shape[0] < max_positions:
            self.rope_cos, self.rope_sin = rope_tables(
                self.config, max_positions, self.model.norm.weight.device
            )

    def lm_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        slots: slice,
        kv_len: int,
        last_only: bool = True,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """fp32 logits `[B, V]` of the last position (or `[B, L, V]` of all) for `input_ids [B, L]`.

        With `lengths [B]` (right padding), the last position of row b is `lengths[b] - 1`.
        """
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[positions].to(x.dtype).unsqueeze(2)
        sin = self.rope_sin[positions].to(x.dtype).unsqueeze(2)
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        keys = torch.arange(kv_len, device=x.device)
        visible = keys <= positions.unsqueeze(-1)
        real = None
        if lengths is not None:
            visible = visible & (keys < lengths.view(-1, 1, 1))
            real = (torch.arange(input_ids.shape[1], device=x.device) < lengths.unsqueeze(1)).view(
                *input_ids.shape, 1, 1
            )
        mask = visible.unsqueeze(1).unsqueeze(1).expand(-1, -1, groups, -1, -1).flatten(2, 3)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, positions, mask, k_caches[i], v_caches[i], slots, kv_len, real)
        if last_only:
            x = x[:, -1] if lengths is None else x[torch.arange(x.shape[0], device=x.device), lengths - 1]
        return F.linear(self.model.norm(x), self.lm_weight()).float()
