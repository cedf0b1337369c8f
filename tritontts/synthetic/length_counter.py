"""Weights that make a random Qwen2 end its speech at a length proportional to its text.

A trained TTS LLM stops after about as many speech tokens as its text takes to say. The synthetic checkpoints
get the same behaviour from a plain Qwen2 forward (nothing custom in the model):

1. Every input embedding row has the same L2 norm, so layer 0's RMSNorm scales every position alike, and a
   `TEXT_CHANNEL` holding `alpha * weight(token)`: `weight = 1 + token_rate * seconds(token)` for text tokens
   (their spoken duration from their bytes, `token_seconds`), 1 for other non-speech tokens (markers, speaker
   tokens) and 0 for speech tokens.
2. Layer 0's query head 0 has zero query weights and bias, so its scores are all 0 and its softmax is uniform
   over the causal context; value dim 0 of its kv head reads `TEXT_CHANNEL` (scaled back to `weight`), and
   `o_proj` writes that head's dim 0 (only) into `LENGTH_CHANNEL`. At position i, `LENGTH_CHANNEL` holds
   `gain * mean(weight[0..i]) = gain * (n_other + token_rate * text_seconds) / (i + 1)`, which falls below
   `gain` exactly when the speech tokens in the context outnumber `token_rate * text_seconds`.
   No other weight writes `LENGTH_CHANNEL` or `TEXT_CHANNEL`; other heads sharing the kv head ignore dim 0.
3. The end token's head row reads `LENGTH_CHANNEL` negatively and the speech channel (which holds the
   current speech token's constant embedding value) positively, balanced at `mean(weight) == 1`: the final
   RMSNorm divides both by the same number, so the sign of the end token's extra logit is exactly
   `1 - mean(weight)`, and `END_SLOPE` makes the switch take a few percent of the length.

With a reference (voice cloning), its text and its speech tokens are both in the prompt, so the generated part
comes out as long as the target text (plus however far the reference's real duration is off the estimate; a
transcript much shorter than its clip ends speech at once). Far from the end (mostly text in the context) the
end token's logit is very negative: in float16 it can reach -inf, which sampling treats as probability 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

SPEECH_CHANNEL = 0
LENGTH_CHANNEL = 1
TEXT_CHANNEL = 2
COUNTING_HEAD = 0
# The length channel's residual value at the balance point: small beside the other channels.
LENGTH_GAIN = 0.05
LENGTH_NORM_WEIGHT = 1000.0  # the final norm's weight on the length channel (the head's weights stay small)
END_SLOPE = 8000.0  # the end token's extra logit per unit of (1 - mean(weight)), times the final 1/rms
# Seconds per spoken unit: read speech runs at about 5 Mandarin syllables/s and 3-4 English words/s
# (~14 letters/s at ~4.5 letters a word); ASCII punctuation and CJK punctuation pause briefly.
CJK_SECONDS = 0.2
LETTER_SECONDS = 1 / 14
PAUSE_SECONDS = 0.1
MAX_TOKEN_SECONDS = 3.0
PAUSES = frozenset(b",.;:!?")
CJK_PUNCTUATION_PREFIXES = (b"\xe3\x80", b"\xef\xbc", b"\xef\xbd")


@dataclass(frozen=True)
class LengthCounter:
    """What the counter needs to know about one checkpoint: its speech-token rate and the end token's row."""

    token_rate: float  # speech tokens per second of audio (Spark-TTS 50, CosyVoice2 25)
    end_row: int | None = None  # the tied embedding row of the end token; None: the caller writes its head

    @property
    def max_weight(self) -> float:
        return 1.0 + self.token_rate * MAX_TOKEN_SECONDS


def token_seconds(data: bytes) -> float:
    """How long the text in one token's bytes takes to say (a token may hold part of a UTF-8 character)."""
    seconds = 0.0
    for i, byte in enumerate(data):
        if byte < 0x80:
            if chr(byte).isalnum():
                seconds += LETTER_SECONDS
            elif byte in PAUSES:
                seconds += PAUSE_SECONDS
        elif byte >= 0xE0:  # the lead byte of a 3- or 4-byte character: CJK ideographs, kana, hangul
            punctuation = data[i : i + 2] in CJK_PUNCTUATION_PREFIXES
            seconds += PAUSE_SECONDS if punctuation else CJK_SECONDS
        elif byte >= 0xC0:  # a 2-byte character: accented Latin, Cyrillic, Greek...
            seconds += LETTER_SECONDS
    return min(seconds, MAX_TOKEN_SECONDS)


def _byte_level_decoder() -> dict[str, int]:
    """The inverse of the GPT-2 byte-to-unicode table that byte-level BPE vocabularies are written in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + extra
            extra += 1
    return {chr(code): b for b, code in table.items()}


def bpe_token_seconds(vocab: Mapping[str, int], size: int) -> torch.Tensor:
    """Spoken seconds per id (0 for ids not in `vocab` or not byte-level strings), shape [size]."""
    decoder = _byte_level_decoder()
    seconds = torch.zeros(size)
    for text, index in vocab.items():
        if index < size and all(c in decoder for c in text):
            seconds[index] = token_seconds(bytes(decoder[c] for c in text))
    return seconds


def text_weights(seconds: torch.Tensor, token_rate: float) -> torch.Tensor:
    """`weight` of step 1 for non-speech rows: 1 + token_rate * seconds."""
    return 1.0 + token_rate * seconds


def fixed_norm_rows(
    random_rows: torch.Tensor, weights: torch.Tensor, speech_values: torch.Tensor, counter: LengthCounter
) -> torch.Tensor:
    """Embedding rows of norm `row_norm(hidden)`: `speech_values` in the speech channel, `alpha * weights`
    in the text channel, 0 in the length channel, the rest `random_rows` rescaled to fill the norm."""
    h = random_rows.shape[1]
    rows = random_rows.to(torch.float32, copy=True)
    rows[:, [SPEECH_CHANNEL, LENGTH_CHANNEL, TEXT_CHANNEL]] = 0.0
    text = text_alpha(h, counter) * weights.float()
    fixed = text.square() + speech_values.float().square()
    rest = torch.linalg.vector_norm(rows, dim=-1).clamp_min(1e-12)
    rows.mul_(((row_norm(h) ** 2 - fixed).clamp_min(0).sqrt() / rest)[:, None])
    rows[:, TEXT_CHANNEL] = text
    rows[:, SPEECH_CHANNEL] = speech_values
    return rows


def row_norm(hidden: int) -> float:
    """The L2 norm of every embedding row: what std-0.05 random rows have, plus room for the fixed channels."""
    return 0.05 * hidden**0.5 + 0.25


def text_alpha(hidden: int, counter: LengthCounter) -> float:
    """Scale of the text channel: the heaviest token takes half of a row's norm."""
    return 0.5 * row_norm(hidden) / counter.max_weight


def install_counter(
    state: dict[str, torch.Tensor],
    num_heads: int,
    num_kv_heads: int,
    num_layers: int,
    counter: LengthCounter,
) -> None:
    """Step 2 (the counting head) and the write-protection of both channels, in place on HF Qwen2 weights
    whose embedding rows are `fixed_norm_rows`."""
    hidden = state["model.embed_tokens.weight"].shape[1]
    head_dim = hidden // num_heads
    group = num_heads // num_kv_heads
    kv = COUNTING_HEAD // group
    query = slice(COUNTING_HEAD * head_dim, (COUNTING_HEAD + 1) * head_dim)
    first = "model.layers.0."
    state[first + "self_attn.q_proj.weight"][query] = 0
    state[first + "self_attn.q_proj.bias"][query] = 0
    value_row = kv * head_dim
    norm_in = float(state[first + "input_layernorm.weight"][TEXT_CHANNEL])
    # Layer 0's RMSNorm turns alpha * weight into alpha * weight * sqrt(h) / row_norm * norm_in.
    value_scale = row_norm(hidden) / (text_alpha(hidden, counter) * hidden**0.5 * norm_in)
    state[first + "self_attn.v_proj.weight"][value_row] = 0
    state[first + "self_attn.v_proj.weight"][value_row, TEXT_CHANNEL] = value_scale
    state[first + "self_attn.v_proj.bias"][value_row] = 0
    for i in range(num_layers):
        prefix = f"model.layers.{i}."
        o_proj = state[prefix + "self_attn.o_proj.weight"]
        o_proj[[LENGTH_CHANNEL, TEXT_CHANNEL]] = 0
        state[prefix + "mlp.down_proj.weight"][[LENGTH_CHANNEL, TEXT_CHANNEL]] = 0
        if i == 0:
            for head in range(kv * group, (kv + 1) * group):
                o_proj[:, head * head_dim] = 0
            o_proj[LENGTH_CHANNEL, COUNTING_HEAD * head_dim] = LENGTH_GAIN
    state["model.norm.weight"][LENGTH_CHANNEL] = LENGTH_NORM_WEIGHT
    state["model.norm.weight"][TEXT_CHANNEL] = 0.0


def end_row_channels(speech_input: float, speech_gain: float) -> tuple[float, float]:
    """(extra weight on the speech channel, weight on the length channel) of the end token's head row.

    The speech channel reaches the head as `speech_input * speech_gain / rms` and the length channel as
    `LENGTH_GAIN * LENGTH_NORM_WEIGHT * mean(weight) / rms`; the end token's extra logit is
    `END_SLOPE * (1 - mean(weight)) / rms`.
    """
    return END_SLOPE / (speech_input * speech_gain), -END_SLOPE / (LENGTH_GAIN * LENGTH_NORM_WEIGHT)
