"""Tensors on the device: prefill requests into consecutive slots, decode slots [0, n) at once, CUDA graphs.

Prefill right-pads the prompts admitted together into one forward (several when their padded size passes
`max_prefill_tokens`); it runs eagerly, as its shapes vary.

A decode step reads and advances only device buffers (KV cache and `SlotState`), so the same function runs
eagerly, under `torch.compile`, or replayed from a CUDA graph captured for each batch-size bucket.
"""

from __future__ import annotations

import bisect
import itertools

import torch

from tritontts.llm.kv_cache import KVCache
from tritontts.llm.model import Qwen2ForCausalLM
from tritontts.llm.sampling import sample
from tritontts.llm.sequence import SamplingParams
from tritontts.llm.slot_state import SlotState


def prefill_chunks(lengths: list[int], max_tokens: int) -> list[int]:
    """Ends of consecutive runs of prompts whose right-padded size (count * longest) stays within
    `max_tokens`; a longer prompt runs alone."""
    ends, count, longest = [], 0, 0
    for i, length in enumerate(lengths):
        if count and (count + 1) * max(longest, length) > max_tokens:
            ends.append(i)
            count, longest = 0, 0
        count, longest = count + 1, max(longest, length)
    return [*ends, len(lengths)]


def batch_buckets(max_batch_size: int) -> list[int]:
    sizes = [1, 2, 4, 8]
    sizes += list(range(16, max_batch_size + 1, 16))
    return sorted({s for s in sizes if s < max_batch_size} | {max_batch_size})


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
    ):
        self.model = model
        self.device = model.model.embed_tokens.weight.device
        self.dtype = model.model.embed_tokens.weight.dtype
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.max_top_k = max_top_k
        self.max_prefill_tokens = max_prefill_tokens
        config = model.config
        model.init_rope(max_seq_len)
        self.rope_tables = (model.rope_cos, model.rope_sin)  # what this runner's CUDA graphs read stays alive
        self.cache = KVCache(config, max_batch_size, max_seq_len, self.device, self.dtype)
        self.state = SlotState(max_batch_size, config.vocab_size, self.device)
        self.buckets = (
            sorted({b for b in graph_batch_sizes if b < max_batch_size} | {max_batch_size})
            if graph_batch_sizes
            else batch_buckets(max_batch_size)
        )
        self.step_fn = self._decode_step
        if compile:
            torch._dynamo.config.recompile_limit = max(
                torch._dynamo.config.recompile_limit, 2 * len(self.buckets)
            )
            self.step_fn = torch.compile(self._decode_step, fullgraph=True, dynamic=False)
        self.pad_to_bucket = cuda_graphs or compile
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if cuda_graphs and self.device.type == "cuda":
            self._capture_graphs()

    def prefill(self, slot: int, prompt_ids: list[int], params: SamplingParams, seed: int) -> torch.Tensor:
        """Fill `slot`'s cache with the prompt and sample the first token; returns it as a 1-element tensor."""
        return self.prefill_batch(slot, [prompt_ids], [params], [seed])

    @torch.inference_mode()
    def prefill_batch(
        self, first_slot: int, prompts: list[list[int]], params: list[SamplingParams], seeds: list[int]
    ) -> torch.Tensor:
        """Prefill prompt i into slot `first_slot + i`, sample its first token; return the `[B]` tokens."""
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
        logits = self.model(ids, positions, self.cache.k, self.cache.v, slots, kv_len=width, lengths=lengths)
        tokens = sample(logits, self.state.rows(slots.start, slots.stop), self.max_top_k)
        for row, prompt in enumerate(prompts):
            self.state.start_decoding(first_slot + row, tokens[row : row + 1], len(prompt))
        return tokens

    @torch.inference_mode()
    def decode(self, n: int) -> torch.Tensor:
        """One token for each of slots [0, n); returns the `[n]` tensor of them (on the device)."""
        batch = self.buckets[bisect.bisect_left(self.buckets, n)] if self.pad_to_bucket else n
        if batch in self.graphs:
            self.graphs[batch].replay()
        else:
            self.step_fn(batch)
        return self.state.last_token[:n]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        self.cache.move(src, dst, length)
        self.state.move(src, dst)

    def free_slot(self, slot: int) -> None:
        self.state.clear(slot)

    def _decode_step(self, batch: int) -> None:
        state = self.state
        tokens, positions = state.last_token[:batch].unsqueeze(1), state.position[:batch].unsqueeze(1)
        logits = self.model(
            tokens, positions, self.cache.k, self.cache.v, slice(0, batch), kv_len=self.max_seq_len
        )
        tokens = sample(logits, state.rows(0, batch), self.max_top_k)
        state.advance(batch, tokens, self.max_seq_len - 1)

    @torch.inference_mode()
    def _capture_graphs(self) -> None:
        """nano-vllm style: largest bucket first, all graphs in one memory pool; slots are reset after."""
        pool = None
        for batch in reversed(self.buckets):
            self.step_fn(batch)  # warm-up (and compilation) outside the graph
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                self.step_fn(batch)
            pool = graph.pool() if pool is None else pool
            self.graphs[batch] = graph
        torch.cuda.synchronize(self.device)
        for slot in range(self.max_batch_size):
            self.state.clear(slot)
