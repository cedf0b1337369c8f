"""The Qwen2 decoder with fused q/k/v and gate/up projections, reading and writing a static KV cache.

One forward serves prefill and decode: tokens `[B, L]` of the B consecutive cache `slots` at `positions
[B, L]` write their keys and values into each layer's `[slots, kv_heads, max_seq_len, head_dim]` buffers
and attend to the first `kv_len` cached positions that are not after their own. Writes index the whole
buffer (never a sliced view of it), so that torch.compile updates the cache in place.

A batched prefill right-pads its prompts and passes their `lengths [B]`: padding neither writes the cache
nor is attended to, and the logits are those of each row's last real position. A prefill from position 0
(`fresh`) attends to its own keys and values rather than reading them back from the cache, causally in SDPA's
fused kernel (right padding comes after every real query, so it needs no mask), and may name its cache rows with
a tensor, so that one CUDA graph serves every slot.

A decode step (one token per row, reading the cache) may instead take the fused Triton kernel of
`tritontts.llm.decode_attention` (`LayerShape.decode_attention`), which reads each row's first
`Context.lengths` keys straight from the cache buffers.

A layer is the pure function `decoder_layer(weights, x, delta, ...)`: it adds the previous layer's output
`delta` to the residual stream before its input norm (fused residual + RMSNorm under torch.compile) and
returns the stream and its own MLP output, so that one compiled layer serves all layers of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tritontts.llm.config import Qwen2Config


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


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


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor) -> torch.Tensor:
    """Softmax attention written out (softmax in fp32), keys where `blocked` is true left out: for one query
    row per head, SDPA's fused kernels (cuDNN's, with a mask) were slower on an H100 than two small matmuls."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(blocked, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), v)


@dataclass(frozen=True)
class LayerShape:
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    decode_attention: str = "torch"  # "triton": decode steps (one query per row) use the fused kernel
    decode_linear: str = "torch"  # "triton": batch-1 decode steps run their projections as skinny kernels
    pdl: bool = False  # the Triton kernels launch with programmatic dependent launch (eager batch-1 steps)


@dataclass(frozen=True)
class Context:
    """What every layer of one forward reads besides its weights and cache."""

    cos: torch.Tensor  # [B, L, 1, head_dim]
    sin: torch.Tensor
    positions: torch.Tensor  # [B, L]
    blocked: (
        torch.Tensor | None
    )  # [B, 1, groups * L or 1, keys]: keys no query may see; keys = cached positions read (None: fresh)
    rows: torch.Tensor  # [B, 1] cache rows written
    slots: slice | None  # cache rows read (None for a fresh prefill)
    real: torch.Tensor | None  # [B, L, 1, 1] for right-padded prompts
    lengths: torch.Tensor | None = None  # [B] keys each row sees: set for the fused decode attention
    counters: torch.Tensor | None = None  # int32 zeros [B * kv_heads]: its splits combine without a kernel


def decode_lengths(positions: torch.Tensor, kv_len: int) -> torch.Tensor:
    """`[B]` keys a decode row at `positions [B, 1]` sees within `kv_len`: the complement of its mask."""
    return (positions[:, 0] + 1).clamp(max=kv_len)


def fused_decode_attention(
    qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, ctx: Context, shape: LayerShape
) -> torch.Tensor:
    """A decode step's attention in the Triton kernel of `tritontts.llm.decode_attention` (imported by whoever
    chose it), from its q/k/v projection `[B, q + 2 kv]`: the kernel rotates the queries and the new keys (RoPE
    at `ctx.cos`, `ctx.sin`), writes the new keys and values into the cache rows `ctx.slots` at `ctx.positions`,
    and row b attends to the first `ctx.lengths[b]` keys of its cache row, read in place."""
    batch, heads, kv_heads, dim = qkv.shape[0], shape.heads, shape.kv_heads, shape.head_dim
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    counters = ctx.counters
    if counters is None:
        counters = torch.zeros(batch * kv_heads, dtype=torch.int32, device=qkv.device)
    return torch.ops.tritontts.decode_attention(
        q.view(batch, heads, dim),
        k_cache,
        v_cache,
        ctx.lengths,
        dim**-0.5,
        counters,
        ctx.cos.reshape(batch, dim),
        ctx.sin.reshape(batch, dim),
        ctx.slots.start or 0,
        k.view(batch, kv_heads, dim),
        v.view(batch, kv_heads, dim),
        ctx.positions.reshape(batch),
        pdl=shape.pdl,
    )


def fresh_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of a prefill from position 0 over its own keys, `q [B, L, heads, dim]`, `k`, `v`
    `[B, L, kv_heads, dim]`: one fused kernel instead of the written-out `attention`, whose masked softmax grows
    with the square of the prompt."""
    batch, length, heads, dim = q.shape
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
    )
    return out.transpose(1, 2).reshape(batch, length, heads * dim)


def attention_block(
    shape: LayerShape,
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: Context,
) -> torch.Tensor:
    """RoPE, cache write and grouped-query attention of the fused q/k/v projection `[B, L, q + 2 kv]`."""
    batch, length, _ = qkv.shape
    heads, kv_heads, dim = shape.heads, shape.kv_heads, shape.head_dim
    groups = heads // kv_heads
    fused = shape.decode_attention == "triton" and ctx.lengths is not None and ctx.slots is not None
    if fused and length == 1:  # a decode step
        return fused_decode_attention(qkv.reshape(batch, -1), k_cache, v_cache, ctx, shape).view(batch, 1, -1)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    k = apply_rope(k.view(batch, length, kv_heads, dim), ctx.cos, ctx.sin)
    v = v.view(batch, length, kv_heads, dim)
    new_k, new_v = k, v
    if ctx.real is not None:  # padding rewrites what the cache already holds
        new_k = torch.where(ctx.real, k, k_cache[ctx.rows, :, ctx.positions])
        new_v = torch.where(ctx.real, v, v_cache[ctx.rows, :, ctx.positions])
    k_cache[ctx.rows, :, ctx.positions] = new_k
    v_cache[ctx.rows, :, ctx.positions] = new_v
    q = apply_rope(q.view(batch, length, heads, dim), ctx.cos, ctx.sin)
    if ctx.slots is None:
        return fresh_prefill_attention(q, k, v)
    kv_len = ctx.blocked.shape[-1]  # a size, not an int argument: torch.compile may keep it dynamic
    keys, values = k_cache[ctx.slots, :, :kv_len], v_cache[ctx.slots, :, :kv_len]
    # Grouped-query attention without copying the cache: the query heads that share a KV head become
    # extra query rows of that head.
    q = q.view(batch, length, kv_heads, groups, dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(batch, kv_heads, groups * length, dim)
    out = attention(q, keys, values, ctx.blocked)
    out = out.view(batch, kv_heads, groups, length, dim).permute(0, 3, 1, 2, 4)
    return out.reshape(batch, length, heads * dim)


def decoder_layer(
    shape: LayerShape,
    weights: tuple[torch.Tensor, ...],
    x: torch.Tensor,
    delta: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    ctx: Context,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer on the residual stream `x` plus the previous layer's MLP output `delta` (None for the
    first layer); returns the stream after attention and this layer's MLP output."""
    input_norm, qkv_w, qkv_b, o_w, post_norm, gate_up_w, down_w = weights
    if norms_in_projections(shape, x):
        x, qkv = norm_project(shape, x, delta, input_norm, qkv_w, qkv_b)
        o = project(shape, attention_block(shape, qkv, k_cache, v_cache, ctx), o_w)
        x, hidden = norm_project(shape, x, o, post_norm, gate_up_w, silu_mul=True)
        return x, project(shape, hidden, down_w, shares=True)
    if delta is not None:
        x = add_delta(x, delta)
    qkv = project(shape, rms_norm(x, input_norm, shape.eps), qkv_w, qkv_b)
    x = x + project(shape, attention_block(shape, qkv, k_cache, v_cache, ctx), o_w)
    hidden = project(shape, rms_norm(x, post_norm, shape.eps), gate_up_w, silu_mul=True)
    return x, project(shape, hidden, down_w, shares=True)


def add_delta(x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """`x + delta`, where `delta` may be fp32 shares `[S, *x.shape]` of a layer's output (see `project`), added up
    element by element so that a compiled caller fuses the sum into what follows."""
    if delta.dim() == x.dim():
        return x + delta
    total = x.float()
    for share in delta.unbind(0):
        total = total + share
    return total.to(x.dtype)


SKINNY_ROWS, DOT_ROWS, SKINNY_IN = 1, 64, 2048  # tritontts.llm.skinny_linear's MAX_ROWS, DOT_ROWS, MAX_IN
NORM_IN = 1024  # tritontts.llm.norm_linear's MAX_IN


def norms_in_projections(shape: LayerShape, x: torch.Tensor) -> bool:
    """Whether a layer's residual adds and RMSNorms run inside its q/k/v and gate/up projections
    (`tritontts.llm.norm_linear`): batch-1 decode steps on the Triton projections."""
    batch, length, width = x.shape
    return shape.decode_linear == "triton" and batch == length == 1 and width <= NORM_IN


def norm_project(
    shape: LayerShape,
    x: torch.Tensor,
    delta: torch.Tensor | None,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`x + delta`, `project(shape, rms_norm(x + delta), weight, bias, silu_mul)`) for one row `x [1, 1, K]` in
    one kernel; `delta` as `add_delta` takes it (fp32 shares `[S, 1, 1, K]` or `[1, 1, K]`), or None."""
    width = x.shape[-1]
    rows = x.reshape(1, width)
    shares = None if delta is None else delta.reshape(-1, 1, width)
    out, residual = torch.ops.tritontts.norm_linear(
        rows, shares, norm_weight, shape.eps, weight, bias, silu_mul, pdl=shape.pdl
    )
    return residual.view(1, 1, width), out.view(1, 1, -1)


def project(
    shape: LayerShape,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    silu_mul: bool = False,
    shares: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)` of `x [B, L, K]`; with `silu_mul`, `silu(gate) * up` of its two halves. Where
    `shape.decode_linear` says so, a decode step takes the Triton kernels of `tritontts.llm.skinny_linear`: at
    SKINNY_ROWS rows every projection (inputs up to SKINNY_IN wide, or any width with `shares`, when the caller takes
    fp32 shares `[S, B, L, N]` that sum to the product: see `add_delta`); up to DOT_ROWS rows all but the MLP's
    down projection (cuBLAS stays faster there)."""
    batch, length, width = x.shape
    skinny = shape.decode_linear == "triton" and length == 1
    if skinny and batch <= SKINNY_ROWS and shares and bias is None and not silu_mul:
        rows = x.reshape(batch, width).contiguous()
        out = torch.ops.tritontts.skinny_linear_partials(rows, weight, pdl=shape.pdl)
        return out.view(out.shape[0], batch, 1, -1)
    if skinny and width <= SKINNY_IN and (batch <= SKINNY_ROWS or (not shares and batch <= DOT_ROWS)):
        rows = x.reshape(batch, width).contiguous()
        return torch.ops.tritontts.skinny_linear(rows, weight, bias, silu_mul, pdl=shape.pdl).view(
            batch, 1, -1
        )
    out = F.linear(x, weight, bias)
    if silu_mul:
        gate, up = out.chunk(2, dim=-1)
        return F.silu(gate) * up
    return out


class Attention(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.qkv_proj = nn.Linear(config.hidden_size, config.hidden_size + 2 * config.kv_dim, bias=True)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)


class DecoderLayer(nn.Module):
    """Holds one layer's parameters (Hugging Face names); `decoder_layer` computes with them."""

    def __init__(self, config: Qwen2Config):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def weights(self) -> tuple[torch.Tensor, ...]:
        attn, mlp = self.self_attn, self.mlp
        return (
            self.input_layernorm.weight,
            attn.qkv_proj.weight,
            attn.qkv_proj.bias,
            attn.o_proj.weight,
            self.post_attention_layernorm.weight,
            mlp.gate_up_proj.weight,
            mlp.down_proj.weight,
        )


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
        self.rope_typed: tuple[torch.Tensor, torch.Tensor] | None = None
        self.index: torch.Tensor | None = None

    def init_rope(self, max_positions: int) -> None:
        """Tables only grow, so a shorter runner of the same model can share them. Besides the fp32 tables,
        copies in the model's dtype and `0, 1, ...` for index views, so a forward launches fewer kernels."""
        if self.rope_cos is None or self.rope_cos.shape[0] < max_positions:
            self.rope_cos, self.rope_sin = rope_tables(
                self.config, max_positions, self.model.norm.weight.device
            )
            self.index = torch.arange(max_positions, device=self.rope_cos.device)
        dtype = self.model.embed_tokens.weight.dtype
        if self.rope_typed is None or self.rope_typed[0].shape != self.rope_cos.shape:
            self.rope_typed = (self.rope_cos.to(dtype), self.rope_sin.to(dtype))

    def lm_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @property
    def layer_shape(self) -> LayerShape:
        c = self.config
        return LayerShape(c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.rms_norm_eps)

    def context(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: slice | torch.Tensor,
        kv_len: int,
        lengths: torch.Tensor | None = None,
        fresh: bool = False,
    ) -> Context:
        """Rope rows, attention mask and cache rows of one forward (see `forward`)."""
        dtype = self.model.embed_tokens.weight.dtype
        cos_table, sin_table = self.rope_typed
        if cos_table.dtype != dtype:  # the model changed dtype after init_rope
            cos_table, sin_table = cos_table.to(dtype), sin_table.to(dtype)
        cos, sin = cos_table[positions].unsqueeze(2), sin_table[positions].unsqueeze(2)
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        length = input_ids.shape[1]
        if isinstance(slots, torch.Tensor):
            if not fresh:
                raise ValueError("cache rows given as a tensor need fresh=True")
            rows = slots.view(-1, 1)
        else:
            rows = self.index[slots].unsqueeze(1)
        real = None
        if lengths is not None:
            real = (self.index[:length] < lengths.unsqueeze(1)).view(*input_ids.shape, 1, 1)
        if fresh:  # SDPA's causal mask is all a fresh prefill needs (fresh_prefill_attention)
            return Context(cos, sin, positions, None, rows, None, real)
        keys = self.index[:kv_len]
        blocked = keys > positions.unsqueeze(-1)
        if lengths is not None:
            blocked = blocked | (keys >= lengths.view(-1, 1, 1))
        blocked = blocked.unsqueeze(1)  # [B, 1, L, keys]
        if length > 1:  # query rows are (group, position): one row of the mask per row
            blocked = blocked.unsqueeze(2).expand(-1, -1, groups, -1, -1).flatten(2, 3)
        return Context(cos, sin, positions, blocked, rows, slots, real)

    def head(
        self,
        x: torch.Tensor,
        delta: torch.Tensor,
        lengths: torch.Tensor | None = None,
        last_only: bool = True,
        output_start: int = 0,
    ) -> torch.Tensor:
        """fp32 logits of the residual stream after the last layer, for vocabulary rows `output_start..` only
        (a view of the head's weight: rows before it are never read)."""
        x = add_delta(x, delta)
        if last_only:
            x = x[:, -1] if lengths is None else x[torch.arange(x.shape[0], device=x.device), lengths - 1]
        return F.linear(self.model.norm(x), self.lm_weight()[output_start:]).float()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        k_caches: list[torch.Tensor],
        v_caches: list[torch.Tensor],
        slots: slice | torch.Tensor,
        kv_len: int,
        last_only: bool = True,
        lengths: torch.Tensor | None = None,
        fresh: bool = False,
        output_start: int = 0,
        layer: Callable[..., tuple[torch.Tensor, torch.Tensor]] = decoder_layer,
    ) -> torch.Tensor:
        """fp32 logits `[B, V]` of the last position (or `[B, L, V]` of all) for `input_ids [B, L]`; with
        `output_start`, of vocabulary rows `output_start..` only (`V` is then the vocabulary minus it).

        With `lengths [B]` (right padding), the last position of row b is `lengths[b] - 1`. `fresh`: a
        prefill from position 0, attending only to its own tokens; `slots` may then be a `[B]` tensor of
        cache rows. `layer`: `decoder_layer` or a compiled function of it.
        """
        ctx = self.context(input_ids, positions, slots, kv_len, lengths, fresh)
        shape = self.layer_shape
        x, delta = self.model.embed_tokens(input_ids), None
        for i, block in enumerate(self.model.layers):
            x, delta = layer(shape, block.weights(), x, delta, k_caches[i], v_caches[i], ctx)
        return self.head(x, delta, lengths, last_only, output_start)
