"""`Flow.decode` for streamed calls, each call's frames decoded after its voice's prefix (the estimator state over
the prompt's stable whole chunks, made once per voice and kept in a `VoicePrefixes`): calls of one voice share one
batch, padded to the longest."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from tritontts.cosyvoice2.flow.flow import Flow, FlowConditions
from tritontts.cosyvoice2.flow.prefix import LayerPrefix
from tritontts.cosyvoice2.flow.prefix_graphs import GraphedPrefixCFM
from tritontts.cosyvoice2.flow.voice_prefixes import VoicePrefixes, stable_prompt_frames
from tritontts.cuda_graphs import CaptureReport, FlowGraphConfig

PREFIX_FRAMES = (100, 200, 300, 400, 600)
"""The prefix lengths (mel frames) a graphed flow captures: a prompt's stable frames round down to one."""
AFTER_PREFIX_BUCKETS = (128, 192, 256, 384, 512)
"""Padded frame counts after the prefix a graphed flow captures; longer calls decode whole."""


@dataclass
class VoicePrefixDecoder:
    """`Flow.voice_decoder`: streamed calls decoded after their voice's prefix (`decode_after_voices`)."""

    flow: Flow
    store: VoicePrefixes
    graphed: GraphedPrefixCFM | None = None

    def __call__(
        self, conditions: Sequence[FlowConditions], voices: Sequence[tuple[str, int]]
    ) -> list[Tensor]:
        return decode_after_voices(self.flow, conditions, voices, self.store, self.graphed)


def use_voice_prefixes(flow: Flow, budget_bytes: int, graphs: FlowGraphConfig | None) -> CaptureReport | None:
    """Decode the flow's streamed calls after their voices' prefixes from now on, keeping at most `budget_bytes`
    of them; with `graphs` (CUDA), from graphs of `PREFIX_FRAMES` x `AFTER_PREFIX_BUCKETS` x its batch sizes,
    captured now (returns their report)."""
    graphed, report = None, None
    if graphs is not None:
        config = FlowGraphConfig(
            AFTER_PREFIX_BUCKETS, graphs.batch_sizes, (True,), graphs.memory_limit_mib, compile=False
        )
        graphed = GraphedPrefixCFM(flow.decoder, flow.config.cfm.n_timesteps, config, PREFIX_FRAMES)
        report = graphed.capture()
    flow.voice_decoder = VoicePrefixDecoder(flow, VoicePrefixes(budget_bytes), graphed)
    return report


def prefix_frames(flow: Flow, prompt_tokens: int, lengths: Sequence[int] | None = None) -> int:
    """The mel frames of a prompt of `prompt_tokens` tokens that its voice's prefix covers (0: none): its stable
    whole chunks, or with `lengths` the longest of them that fits those."""
    chunk_frames = flow.decoder.estimator.config.static_chunk_size
    ratio = flow.token_mel_ratio
    stable = stable_prompt_frames(prompt_tokens, flow.pre_lookahead_len, chunk_frames // ratio, ratio)
    if lengths is None:
        return stable
    return max((n for n in lengths if n <= stable), default=0)


def decode_after_voices(
    flow: Flow,
    conditions: Sequence[FlowConditions],
    voices: Sequence[tuple[str, int]],
    store: VoicePrefixes,
    graphed: GraphedPrefixCFM | None = None,
) -> list[Tensor]:
    """What `flow.decode(conditions)` gives (the target's mel, float32 [1, 80, T - prompt_frames] each) for
    streamed calls; `voices[i]`: call i's voice key and prompt tokens. Calls whose prompt has no stable whole
    chunk (with `graphed`: none of its prefix lengths) go through `flow.decode`; with `graphed`, a voice's calls
    run in batches of at most its largest batch size, and a batch it has no graph for, or of one row, goes through
    `flow.decode` (one row decodes 4-6% faster from the flow's whole-call graph than after its prefix on an H100:
    benchmarks/flow_prefix_graphs_h100_full_synthetic.json); the voice's prefix is made all the same, for its
    later batches."""
    lengths = graphed.prefix_frames if graphed is not None else None
    mels: list[Tensor | None] = [None] * len(conditions)
    groups: dict[tuple[str, int], list[int]] = {}
    plain = []
    for i, (c, (key, tokens)) in enumerate(zip(conditions, voices)):
        start = prefix_frames(flow, tokens, lengths)
        if not c.streaming or start == 0 or start > c.prompt_frames:
            plain.append(i)
        else:
            groups.setdefault((key, start), []).append(i)
    steps = flow.config.cfm.n_timesteps
    batches, prefixes_only = [], []
    for (key, start), members in groups.items():
        widest = max(graphed.config.batch_sizes) if graphed is not None else len(members)
        for first_row in range(0, len(members), widest):
            batch = members[first_row : first_row + widest]
            after = max(conditions[i].mu.size(2) for i in batch) - start
            if graphed is not None and not graphed.routes(len(batch), start, after):
                plain.extend(batch)
            elif graphed is not None and len(batch) == 1:
                plain.extend(batch)
                prefixes_only.append((key, start, batch[0]))
            else:
                batches.append((key, start, batch))
    for i, mel in zip(plain, flow.decode([conditions[i] for i in plain])):
        mels[i] = mel
    for key, start, first in prefixes_only:
        _stored_prefix(flow, store, key, conditions[first], start, steps)
    for key, start, batch in batches:
        prefix = _stored_prefix(flow, store, key, conditions[batch[0]], start, steps)
        rows = [conditions[i] for i in batch]
        for i, mel in zip(batch, _decode_group(flow, rows, prefix, start, steps, key, graphed)):
            mels[i] = mel
    return mels


def _stored_prefix(
    flow: Flow, store: VoicePrefixes, key: str, first: FlowConditions, start: int, steps: int
) -> list[LayerPrefix]:
    return store.get(key, lambda: _make_prefix(flow, first, start, steps))


def _make_prefix(flow: Flow, c: FlowConditions, start: int, steps: int) -> list[LayerPrefix]:
    _, prefixes = flow.decoder.solve_after(
        None, c.mu[:, :, :start], c.spks, c.cond[:, :, :start], steps, keep=start
    )
    return prefixes


def _decode_group(
    flow: Flow,
    rows: Sequence[FlowConditions],
    prefix: list[LayerPrefix],
    start: int,
    steps: int,
    voice: str,
    graphed: GraphedPrefixCFM | None,
) -> list[Tensor]:
    frames = max(c.mu.size(2) for c in rows) - start
    first = rows[0].mu
    mu = first.new_zeros(len(rows), first.size(1), frames)
    cond = torch.zeros_like(mu)
    mask = first.new_zeros(len(rows), 1, frames)
    for row, c in enumerate(rows):
        length = c.mu.size(2) - start
        mu[row, :, :length], cond[row, :, :length], mask[row, :, :length] = (
            c.mu[0, :, start:],
            c.cond[0, :, start:],
            1,
        )
    spks = torch.cat([c.spks for c in rows])
    if graphed is not None:
        mel = graphed(voice, prefix, mu, spks, cond, mask)
    else:
        mel, _ = flow.decoder.solve_after(prefix, mu, spks, cond, steps, mask=mask)
    return [
        mel[row : row + 1, :, c.prompt_frames - start : c.mu.size(2) - start] for row, c in enumerate(rows)
    ]
