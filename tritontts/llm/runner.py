"""Tensors on the device: prefill requests into slots, decode slots [0, n) at once, CUDA graphs.

Decode: a step reads and advances only device buffers (KV cache and `SlotState`), so the same function runs
eagerly, with its layers and its head (logits, sampling, stop bookkeeping) under `torch.compile`, or replayed
from a CUDA graph. A step attends to the first `kv_len` cached positions, `kv_len` the smallest bucket that
holds the longest running sequence, so short sequences do not read the whole static cache; there is one
graph for each (batch-size bucket, kv-length bucket). Under torch.compile one compiled layer serves every
layer (its weights are arguments) and the key length stays a dynamic size, so compiling costs one layer per
batch bucket rather than the whole model per graph.

Prefill: a prompt no longer than the largest prefill bucket is right-padded to the next bucket and runs
alone through that bucket's forward + sampling (under torch.compile its layers run as one compiled layer of
their own, whose prompt length is dynamic), captured once as a CUDA graph that reads its cache row, ids
and length from static buffers (one graph serves every slot). Longer prompts are right-padded together into
eager forwards (several when their padded size passes `max_prefill_tokens`). Padding is masked either way.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tritontts.llm.buckets import batch_buckets, bucket_of, kv_buckets, prefill_buckets, prefill_chunks
from tritontts.llm.decode_kernels import resolve_decode_attention
from tritontts.llm.kv_cache import KVCache
from tritontts.llm.model import Context, LayerShape, Qwen2ForCausalLM, decode_lengths, decoder_layer
from tritontts.llm.pdl import pdl_problem
from tritontts.llm.sampling import SMALL_TOP_K, choose, sample, sampling_logits
from tritontts.llm.sequence import SamplingParams
from tritontts.llm.slot_state import SlotState


@dataclass
class PendingTokens:
    """A decode step's tokens on their way to the host: copied into pinned memory behind the step."""

    host: torch.Tensor
    event: torch.cuda.Event | None

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()


def prefill_layer(*args) -> tuple[torch.Tensor, torch.Tensor]:
    """`decoder_layer` under its own code object: compiled for prefill, its cache of compiled variants (prompt
    length dynamic) stays apart from the decode steps' (static sizes, one per batch bucket)."""
    return decoder_layer(*args)


class ModelRunner:
    def __init__(
        self,
        model: Qwen2ForCausalLM,
        max_batch_size: int = 16,
        max_seq_len: int = 2560,
        cuda_graphs: bool = True,
        compile: bool = False,
        max_top_k: int = 1024,
        graph_batch_sizes: list[int] | None = None,
        max_prefill_tokens: int = 8192,
        kv_lengths: list[int] | None = None,
        prefill_lengths: list[int] | None = None,
        decode_attention: str = "auto",
        decode_linear: str = "auto",
        top_k_kernel: str = "auto",
        output_tokens_from: int = 0,
        compile_prefill: bool = True,
        decode_pdl: bool | None = None,
    ):
        """`output_tokens_from`: the first vocabulary id the model may output; the head computes only the rows
        from it on (a speech LLM whose outputs all follow its text vocabulary reads a fraction of the head's
        weight each step). `kv_lengths`: key-length buckets of decode (default `kv_buckets`). `prefill_lengths`: padded
        prompt lengths prefilled one prompt at a time (default `prefill_buckets` where CUDA graphs are
        captured, none elsewhere; pass some on CPU to run the same padded path eagerly).
        `decode_attention`, `decode_linear`, `top_k_kernel`: "auto", "torch" or "triton" (see
        `resolve_decode_attention`). `compile_prefill`: with `compile`, the padded prefill's layers run compiled too
        (one compiled layer, its prompt length dynamic after the first bucket). `decode_pdl`: batch-1 decode steps,
        whose layers are then all Triton kernels (`decode_linear` and `decode_attention` resolved to "triton"), run
        their layers uncompiled with the kernels launched by programmatic dependent launch (`tritontts.llm.pdl`);
        None: where the device and kernels allow it, True: or raise, False: never.

        Decode samples among `max_top_k` candidates (the whole vocabulary when smaller). When every running
        request wants at most SMALL_TOP_K (greedy ones want one), a step selects only that many, the rest
        of its candidates -inf, by the Triton top-k kernel where `top_k_kernel` resolves to "triton": so
        each (batch, key length) bucket has a graph per candidate count (`candidate_counts`)."""
        self.model = model
        self.device = model.model.embed_tokens.weight.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_top_k = max_top_k
        self.max_prefill_tokens = max_prefill_tokens
        config = model.config
        model.init_rope(max_seq_len)
        # What this runner's CUDA graphs read stays alive, should the model grow its tables for another.
        self.rope_tables = (model.rope_typed, model.index)
        self.cache = KVCache(config, max_batch_size, max_seq_len, self.device, self.dtype)
        if not 0 <= output_tokens_from < config.vocab_size:
            raise ValueError(
                f"output_tokens_from must be in [0, {config.vocab_size}), got {output_tokens_from}"
            )
        self.output_start = output_tokens_from
        self.output_size = config.vocab_size - output_tokens_from
        self.state = SlotState(
            max_batch_size, config.vocab_size, self.device, output_start=output_tokens_from
        )
        self.attention_counters = torch.zeros(
            max_batch_size * config.num_key_value_heads, dtype=torch.int32, device=self.device
        )
        self.decode_attention = resolve_decode_attention(decode_attention, self.device, config.head_dim)
        self.decode_linear = resolve_decode_attention(
            decode_linear, self.device, config.head_dim, "decode_linear"
        )
        self.top_k_kernel = resolve_decode_attention(
            top_k_kernel, self.device, config.head_dim, "top_k_kernel"
        )
        self.top_k_width = min(max_top_k, self.output_size)
        self.candidate_counts = sorted({min(SMALL_TOP_K, self.top_k_width), self.top_k_width})
        self.shape = dataclasses.replace(
            model.layer_shape, decode_attention=self.decode_attention, decode_linear=self.decode_linear
        )
        self.pdl_shape = self._pdl_shape(decode_pdl)
        self.weights = [tuple(w.detach() for w in layer.weights()) for layer in model.model.layers]
        self.buckets = (
            sorted({b for b in graph_batch_sizes if b < max_batch_size} | {max_batch_size})
            if graph_batch_sizes
            else batch_buckets(max_batch_size)
        )
        self.kv_lengths = sorted({min(n, max_seq_len) for n in kv_lengths or kv_buckets(max_seq_len)})
        if self.kv_lengths[-1] != max_seq_len:
            self.kv_lengths.append(max_seq_len)
        graphs = cuda_graphs and self.device.type == "cuda"
        if prefill_lengths is None:
            prefill_lengths = prefill_buckets(max_seq_len) if graphs else []
        if any(n >= max_seq_len for n in prefill_lengths):
            raise ValueError(f"prefill_lengths must be below max_seq_len {max_seq_len}: {prefill_lengths}")
        self.prefill_lengths = sorted(set(prefill_lengths))
        widest = max(self.prefill_lengths, default=0)
        self.prefill_ids = torch.zeros(1, widest, dtype=torch.int64, device=self.device)
        self.prefill_length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.prefill_slot = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.prefill_token = torch.zeros(1, dtype=torch.int64, device=self.device)
        self.prefill_positions = torch.arange(widest, device=self.device).unsqueeze(0)
        pinned = self.device.type == "cuda"
        self.host_tokens = [torch.zeros(max_batch_size, dtype=torch.int64, pin_memory=pinned) for _ in "ab"]
        self.host_turn = 0
        self.compiled = compile
        self.layer_fn = decoder_layer
        self.logits_fn = self._sampling_logits
        self.advance_fn = self._advance
        self.inputs_fn = self._decode_inputs
        self.prefill_layer_fn = decoder_layer
        if compile:
            limit = 8 * len(self.buckets) + 16
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
            self.layer_fn = torch.compile(decoder_layer, fullgraph=True, dynamic=False)
            self.logits_fn = torch.compile(self._sampling_logits, fullgraph=True, dynamic=False)
            self.advance_fn = torch.compile(self._advance, fullgraph=True, dynamic=False)
            self.inputs_fn = torch.compile(
                self._decode_inputs, fullgraph=True
            )  # sizes go dynamic on recompiles
            if compile_prefill:
                self.prefill_layer_fn = torch.compile(prefill_layer, fullgraph=True)
        self.pad_to_bucket = cuda_graphs or compile
        self.graphs: dict[tuple[int, int, int], torch.cuda.CUDAGraph] = {}
        self.prefill_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if graphs:
            self._capture_graphs()

    def prefill(self, slot: int, prompt_ids: list[int], params: SamplingParams, seed: int) -> torch.Tensor:
        """Fill `slot`'s cache with the prompt and sample the first token; returns it as a 1-element tensor."""
        return self.prefill_batch(slot, [prompt_ids], [params], [seed])

    @torch.inference_mode()
    def prefill_batch(
        self, first_slot: int, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int]
    ) -> torch.Tensor:
        """Prefill prompt i into slot `first_slot + i`, sample its first token; return the `[B]` tokens."""
        widest = max(self.prefill_lengths, default=0)
        tokens, start = [], 0
        while start < len(prompts):
            if len(prompts[start]) <= widest:
                tokens.append(
                    self._prefill_one(first_slot + start, prompts[start], params[start], seeds[start])
                )
                start += 1
                continue
            stop = start
            while stop < len(prompts) and len(prompts[stop]) > widest:
                stop += 1
            run = slice(start, stop)
            tokens.append(self._prefill_eager(first_slot + start, prompts[run], params[run], seeds[run]))
            start = stop
        return torch.cat(tokens)

    def _prefill_eager(
        self, first_slot: int, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int]
    ) -> torch.Tensor:
        tokens, start = [], 0
        for stop in prefill_chunks([len(p) for p in prompts], self.max_prefill_tokens):
            run = slice(start, stop)
            tokens.append(self._prefill_chunk(first_slot + start, prompts[run], params[run], seeds[run]))
            start = stop
        return torch.cat(tokens)

    def _prefill_chunk(
        self, first_slot: int, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int]
    ) -> torch.Tensor:
        batch, width = len(prompts), max(map(len, prompts))
        padded = [p + [0] * (width - len(p)) for p in prompts]
        host = torch.tensor([*itertools.chain.from_iterable(padded), *map(len, prompts)], dtype=torch.int64)
        ids, lengths = host.to(self.device).split([batch * width, batch])
        ids = ids.view(batch, width)
        for row, prompt in enumerate(prompts):
            self.state.assign(first_slot + row, params[row], seeds[row], ids[row, : len(prompt)])
        positions = torch.arange(width, device=self.device).expand(batch, width)
        slots = slice(first_slot, first_slot + batch)
        logits = self.model(
            ids,
            positions,
            self.cache.k,
            self.cache.v,
            slots,
            kv_len=width,
            lengths=lengths,
            fresh=True,
            output_start=self.output_start,
        )
        tokens = sample(logits, self.state.rows(slots.start, slots.stop), self.max_top_k, self.output_start)
        for row, prompt in enumerate(prompts):
            self.state.start_decoding(first_slot + row, tokens[row : row + 1], len(prompt))
        return tokens

    def _prefill_one(self, slot: int, prompt: list[int], params: SamplingParams, seed: int) -> torch.Tensor:
        """One prompt through its padded bucket (graph when captured) into `slot`."""
        width, n = bucket_of(self.prefill_lengths, len(prompt)), len(prompt)
        host = torch.tensor([*prompt, *[0] * (width - n), n, slot], dtype=torch.int64)
        values = host.to(self.device)
        self.prefill_ids[:, :width].copy_(values[:width].unsqueeze(0))
        self.prefill_length.copy_(values[width : width + 1])
        self.prefill_slot.copy_(values[width + 1 :])
        self.state.assign(slot, params, seed, values[:n])
        if width in self.prefill_graphs:
            self.prefill_graphs[width].replay()
        else:
            self._prefill_padded(width)
        token = self.prefill_token.clone()
        self.state.start_decoding(slot, token, n)
        return token

    def _prefill_padded(self, width: int) -> None:
        """Reads and writes only static buffers: the function a prefill graph captures."""
        logits = self.model(
            self.prefill_ids[:, :width],
            self.prefill_positions[:, :width],
            self.cache.k,
            self.cache.v,
            self.prefill_slot,
            kv_len=width,
            lengths=self.prefill_length,
            fresh=True,
            output_start=self.output_start,
            layer=self.prefill_layer_fn,
        )
        state = self.state.take(self.prefill_slot)
        self.prefill_token.copy_(sample(logits, state, self.max_top_k, self.output_start))

    def kv_bucket(self, kv_len: int) -> int:
        return bucket_of(self.kv_lengths, min(kv_len, self.max_seq_len))

    def candidates(self, params: Iterable[SamplingParams]) -> int:
        """The fewest candidates (of `candidate_counts`) a decode step of requests with these settings needs."""
        wanted = max((1 if p.greedy else p.top_k or self.top_k_width for p in params), default=1)
        return self.candidate_counts[bisect.bisect_left(self.candidate_counts, min(wanted, self.top_k_width))]

    @torch.inference_mode()
    def decode(self, n: int, kv_len: int | None = None, candidates: int | None = None) -> torch.Tensor:
        """One token for each of slots [0, n), whose sequences (prompt + tokens so far) are at most `kv_len`
        long (default: any length), sampled among `candidates` (one of `candidate_counts`, default all) most
        likely tokens; returns the `[n]` tensor of tokens (on the device)."""
        batch = bucket_of(self.buckets, n) if self.pad_to_bucket else n
        keys = self.kv_bucket(kv_len or self.max_seq_len)
        count = candidates or self.top_k_width
        if count not in self.candidate_counts:
            raise ValueError(f"candidates must be one of {self.candidate_counts}, got {count}")
        if (batch, keys, count) in self.graphs:
            self.graphs[batch, keys, count].replay()
        else:
            self._decode_step(batch, keys, count)
        return self.state.last_token[:n]

    def decode_async(self, n: int, kv_len: int | None = None, candidates: int | None = None) -> PendingTokens:
        """`decode`, then its tokens copied to the host without waiting: the caller may queue more work
        (the next step) before it reads them. Two host buffers: read a step's tokens before the one after
        the next is queued."""
        tokens = self.decode(n, kv_len, candidates)
        host = self.host_tokens[self.host_turn][:n]
        self.host_turn ^= 1
        host.copy_(tokens, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return PendingTokens(host, event)

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.move(src, dst, length)
        self.state.move(src, dst)

    def free_slot(self, slot: int) -> None:
        self.state.clear(slot)

    def _pdl_shape(self, wanted: bool | None) -> LayerShape | None:
        if wanted is False:
            return None
        problem = pdl_problem(self.device)
        if problem is None and "torch" in (self.decode_linear, self.decode_attention):
            problem = "needs decode_linear and decode_attention on the Triton kernels"
        if problem is None:
            return dataclasses.replace(self.shape, pdl=True)
        if wanted:
            raise ValueError(f"decode_pdl {problem}")
        return None

    def _decode_step(self, batch: int, kv_len: int, candidates: int) -> None:
        x, cos, sin, blocked, rows, positions, lengths = self.inputs_fn(batch, kv_len)
        counters = self.attention_counters if lengths is not None else None
        ctx = Context(cos, sin, positions, blocked, rows, slice(0, batch), None, lengths, counters)
        layer_fn, shape = self.layer_fn, self.shape
        if batch == 1 and self.pdl_shape is not None:  # launches a compiled layer would make without PDL
            layer_fn, shape = decoder_layer, self.pdl_shape
        elif self.compiled:
            torch._dynamo.maybe_mark_dynamic(ctx.blocked, 3)  # one compiled layer for every key length
        delta = None
        for weights, k_cache, v_cache in zip(self.weights, self.cache.k, self.cache.v):
            x, delta = layer_fn(shape, weights, x, delta, k_cache, v_cache, ctx)
        logits = self.logits_fn(batch, x, delta)
        self.advance_fn(batch, *self._select(logits, candidates))

    def _decode_inputs(self, batch: int, kv_len: int) -> tuple:
        """A decode step's embedded tokens and what its layers read besides (see `Context`), from the slots'
        state: under torch.compile one kernel or two rather than one per gather and mask."""
        state = self.state
        tokens, positions = state.last_token[:batch].unsqueeze(1), state.position[:batch].unsqueeze(1)
        ctx = self.model.context(tokens, positions, slice(0, batch), kv_len)
        lengths = decode_lengths(positions, kv_len) if self.decode_attention == "triton" else None
        x = self.model.model.embed_tokens(tokens)
        return x, ctx.cos, ctx.sin, ctx.blocked, ctx.rows, ctx.positions, lengths

    def _sampling_logits(self, batch: int, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        logits = self.model.head(x, delta, output_start=self.output_start)
        return sampling_logits(logits, self.state.rows(0, batch))

    def _select(self, logits: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The `count` largest logits of each row and their vocabulary ids, then -inf up to `top_k_width`."""
        if self.top_k_kernel == "triton" and count <= SMALL_TOP_K:
            values, ids = torch.ops.tritontts.top_k(logits, count, self.top_k_width)
        else:
            values, ids = logits.topk(count, dim=-1)
            pad = self.top_k_width - count
            if pad:
                values, ids = F.pad(values, (0, pad), value=float("-inf")), F.pad(ids, (0, pad))
        return values, ids + self.output_start if self.output_start else ids

    def _advance(self, batch: int, values: torch.Tensor, ids: torch.Tensor) -> None:
        """Sampling among the candidates and the slots' advance (no host sync)."""
        tokens = choose(values, ids, self.state.rows(0, batch))
        self.state.advance(batch, tokens, self.max_seq_len - 1)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """nano-vllm style: largest shapes first, all decode graphs in one memory pool; slots reset after."""
        for batch in self.buckets:  # compile (a no-op when eager) with a key length below the largest
            self._decode_step(batch, self.kv_lengths[0], self.top_k_width)
        pool = None
        for batch in reversed(self.buckets):
            for keys, count in itertools.product(reversed(self.kv_lengths), reversed(self.candidate_counts)):
                self._decode_step(batch, keys, count)  # warm-up outside the graph
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                    self._decode_step(batch, keys, count)
                pool = graph.pool() if pool is None else pool
                self.graphs[batch, keys, count] = graph
        for width in reversed(self.prefill_lengths):
            self._prefill_padded(width)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self._prefill_padded(width)
            self.prefill_graphs[width] = graph
        torch.cuda.synchronize(self.device)
        for slot in range(self.max_batch_size):
            self.state.clear(slot)
