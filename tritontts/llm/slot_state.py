"""Per-slot device tensors a decode step reads and advances: last token, position, sampling settings."""

from __future__ import annotations

import torch

from tritontts.llm.sampling import SamplingBatch
from tritontts.llm.sequence import SamplingParams

FIELDS = (
    "last_token",
    "position",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "seed",
    "end_id",
    "min_tokens",
    "step",
)
FLOAT_FIELDS = ("temperature", "top_p", "repetition_penalty")
MAX_BAD_TOKENS = 256
"""Bad token ids a request may name (CosyVoice3's bistream masks 199); each step masks this many per slot."""


class SlotState:
    """`last_token` and `position` hold vocabulary ids; what sampling reads (`seen`, `end_id`, `bad_ids`) is
    indexed like the logits, which start at vocabulary id `output_start` (ids below it are never sampled: a
    bad id there masks nothing, an end id there is -1)."""

    def __init__(
        self,
        slots: int,
        vocab_size: int,
        device: torch.device,
        max_bad_tokens: int = MAX_BAD_TOKENS,
        output_start: int = 0,
    ):
        for name in FIELDS:
            dtype = torch.float32 if name in FLOAT_FIELDS else torch.int64
            setattr(self, name, torch.zeros(slots, dtype=dtype, device=device))
        self.output_start = output_start
        self.seen = torch.zeros(slots, vocab_size - output_start, dtype=torch.bool, device=device)
        self.max_bad_tokens = max(max_bad_tokens, 1)
        self.bad_ids = torch.full((slots, self.max_bad_tokens), -1, dtype=torch.int64, device=device)

    def rows(self, start: int, stop: int) -> SamplingBatch:
        return SamplingBatch(
            temperature=self.temperature[start:stop],
            top_k=self.top_k[start:stop],
            top_p=self.top_p[start:stop],
            repetition_penalty=self.repetition_penalty[start:stop],
            seed=self.seed[start:stop],
            end_id=self.end_id[start:stop],
            min_tokens=self.min_tokens[start:stop],
            step=self.step[start:stop],
            seen=self.seen[start:stop],
            bad_ids=self.bad_ids[start:stop],
        )

    def take(self, rows: torch.Tensor) -> SamplingBatch:
        """Copies of the rows named by the device tensor `rows` (a graph replayed for any slot reads them)."""
        return SamplingBatch(
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            repetition_penalty=self.repetition_penalty[rows],
            seed=self.seed[rows],
            end_id=self.end_id[rows],
            min_tokens=self.min_tokens[rows],
            step=self.step[rows],
            seen=self.seen[rows],
            bad_ids=self.bad_ids[rows],
        )

    def assign(self, slot: int, params: SamplingParams, seed: int, prompt_ids: torch.Tensor) -> None:
        """Settings of a new request; position and last token are set after its prefill. Its bad ids are padded
        by repeating the first (a row without any holds -1: masks nothing), so no two entries of a row scatter
        different values into one logit."""
        if len(params.bad_token_ids) > self.max_bad_tokens:
            raise ValueError(
                f"at most {self.max_bad_tokens} bad token ids per request, got {len(params.bad_token_ids)}"
            )
        start = self.output_start
        bad = [t - start for t in params.bad_token_ids if t >= start]
        end_id = -1 if params.end_id is None or params.end_id < start else params.end_id - start
        padding = bad[:1] or [-1]
        values = {
            "temperature": params.temperature,
            "top_k": params.top_k,
            "top_p": params.top_p,
            "repetition_penalty": params.repetition_penalty,
            "seed": seed & (2**63 - 1),
            "end_id": end_id,
            "min_tokens": params.min_tokens,
            "step": 0,
            "position": 0,
            "last_token": 0,
        }
        for name, value in values.items():
            getattr(self, name)[slot] = value
        self.seen[slot] = False
        self.seen[slot, prompt_ids[prompt_ids >= start] - start if start else prompt_ids] = True
        self.bad_ids[slot] = torch.tensor(bad + padding * (self.max_bad_tokens - len(bad)), dtype=torch.int64)

    def start_decoding(self, slot: int, token: torch.Tensor, prompt_len: int) -> None:
        """After prefill sampled `token` (a 1-element tensor): the next decode feeds it at `prompt_len`."""
        self.last_token[slot : slot + 1] = token
        self.position[slot] = prompt_len
        self.step[slot] = 1
        self.seen[slot].scatter_(0, token - self.output_start, True)

    def advance(self, stop: int, tokens: torch.Tensor, max_position: int) -> None:
        """After a decode step over rows [0, stop): graph-capturable, no host sync.

        Writes index whole buffers (no sliced views), so that torch.compile updates them in place.
        """
        rows = torch.arange(stop, device=tokens.device)
        self.position.index_put_((rows,), (self.position[:stop] + 1).clamp(max=max_position))
        self.step.index_put_((rows,), self.step[:stop] + 1)
        self.last_token.index_put_((rows,), tokens)
        self.seen.index_put_((rows, tokens - self.output_start), torch.ones_like(tokens, dtype=torch.bool))

    def move(self, src: int, dst: int) -> None:
        for name in (*FIELDS, "seen", "bad_ids"):
            tensor = getattr(self, name)
            tensor[dst] = tensor[src]

    def clear(self, slot: int) -> None:
        self.position[slot] = 0
