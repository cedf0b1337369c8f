"""Random CosyVoice2 LLM weights in three on-disk forms: `llm.pt` (upstream's Qwen2LM state_dict),
`CosyVoice-BlankEN/` (the Qwen2 it starts from) and `cosyvoice2_llm/` (the Hugging Face Qwen2ForCausalLM that
the Triton runtime serves), all holding the same network.

`cosyvoice2_llm` is derived from `llm.pt` the way upstream's pretrained_to_huggingface.py does it: the speech
embedding (6561 speech tokens + 3 stop rows) sits at `<|s_0|>`.., `llm_embedding` (sos, task_id) at
`<|sos|> <|task_id|>`, and the untied lm_head is zero except for the speech head's rows (its bias dropped, as in
the published checkpoint). The model "speaks" through hidden channel 0 (see qwen2.qwen2_state_dict): the speech
head weighs that channel positively for speech tokens and negatively for `<|eos2|>`, `<|eos3|>`; text tokens
keep logit 0 as in the real checkpoint. `<|eos1|>` ends speech once the speech tokens in the context cover the
text at 25 tokens/s (tritontts.synthetic.length_counter): every embedding row (text, speech, sos/task_id) has
the counter's fixed norm and weight, and `<|eos1|>`'s head row reads its length channel.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tritontts.cosyvoice2 import tokens as cv
from tritontts.spark.tokens import AddedToken
from tritontts.synthetic.length_counter import (
    LENGTH_CHANNEL,
    SPEECH_CHANNEL,
    TEXT_CHANNEL,
    LengthCounter,
    bpe_token_seconds,
    end_row_channels,
    fixed_norm_rows,
    text_weights,
)
from tritontts.synthetic.presets import preset_entry
from tritontts.synthetic.qwen2 import (
    DTYPE_NAMES,
    PRESETS,
    SPEECH_CHANNEL_GAIN,
    SPEECH_CHANNEL_INPUT,
    TEXT_CHANNEL_INPUT,
    generation_config,
    qwen2_config,
    qwen2_state_dict,
    write_weights,
)
from tritontts.synthetic.tokenizer import SpecialTokens, qwen2_bpe_vocab, write_qwen2_tokenizer

SPEECH_HEAD_ROWS = cv.SPEECH_TOKEN_COUNT + len(cv.SPEECH_STOP_TOKENS)
LLM_EMBEDDING_ROWS = 2
EMBED_STD = 0.05
# Calibrated on one prompt: speech tokens ~7 (tiny) / ~10 (full) logits above text.
SPEECH_LOGIT_WEIGHT = {"tiny": 0.1, "full": 0.5}
SPEECH_TOKEN_RATE = 25  # CosyVoice2's speech tokens per second of audio
COUNTER = LengthCounter(SPEECH_TOKEN_RATE)
LLM_DTYPE = torch.bfloat16
BLANK_EN_DTYPE = torch.bfloat16
CHAT_TEMPLATE = (
    "{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{- '<|sos|>' + message['content'] + '<|task_id|>' }}{%- elif message['role'] == 'assistant' %}"
    "{{- message['content']}}{%- endif %}{%- endfor %}"
)
BLANK_EN_SPECIAL = SpecialTokens(cv.TEXT_EOS_TOKEN, cv.TEXT_EOS_TOKEN, cv.BLANK_EN_ADDED_TOKENS[1:])
LLM_SPECIAL = SpecialTokens(cv.TEXT_EOS_TOKEN, cv.TEXT_EOS_TOKEN, cv.COSYVOICE2_SPECIAL_TOKENS)


def _hidden(preset: str) -> int:
    return preset_entry(PRESETS, preset).hidden_size


def text_row_weights() -> torch.Tensor:
    """The length counter's weight of each Qwen2 text id: by its spoken seconds; added tokens 1."""
    vocab, _ = qwen2_bpe_vocab()
    return text_weights(bpe_token_seconds(vocab, cv.QWEN2_VOCAB_SIZE), SPEECH_TOKEN_RATE)


def other_rows(rows: int, h: int, gen: torch.Generator) -> torch.Tensor:
    """Embedding rows of non-speech, non-text tokens (sos, task_id, unused ids): weight 1, text-like."""
    random = torch.randn(rows, h, generator=gen) * EMBED_STD
    return fixed_norm_rows(random, torch.ones(rows), torch.full((rows,), TEXT_CHANNEL_INPUT), COUNTER)


def speech_rows(rows: int, h: int, gen: torch.Generator) -> torch.Tensor:
    """Embedding rows of speech tokens: weight 0 (they add no text), the speech channel's input value."""
    random = torch.randn(rows, h, generator=gen) * EMBED_STD
    return fixed_norm_rows(random, torch.zeros(rows), torch.full((rows,), SPEECH_CHANNEL_INPUT), COUNTER)


def counting_qwen2(preset: str, seed: int) -> dict[str, torch.Tensor]:
    """The Qwen2 body (HF names, fp32, tied) with the length counter over the Qwen2 text vocabulary."""
    return qwen2_state_dict(
        preset, seed, cv.QWEN2_VOCAB_SIZE, torch.float32, (0, 0), COUNTER, text_row_weights()
    )


def speech_head(rows: int, end_row: int, h: int, gen: torch.Generator, preset: str) -> torch.Tensor:
    """The speech decoder's weight `[rows, h]`: the 6561 speech rows read the speech channel positively, the
    rest negatively, except `end_row`, which ends speech once the context's speech covers its text."""
    decoder = torch.randn(rows, h, generator=gen) * EMBED_STD
    decoder[:, [LENGTH_CHANNEL, TEXT_CHANNEL]] = 0
    decoder[: cv.SPEECH_TOKEN_COUNT, SPEECH_CHANNEL] = SPEECH_LOGIT_WEIGHT[preset]
    decoder[cv.SPEECH_TOKEN_COUNT :, SPEECH_CHANNEL] = -SPEECH_LOGIT_WEIGHT[preset]
    extra, length = end_row_channels(SPEECH_CHANNEL_INPUT, SPEECH_CHANNEL_GAIN)
    decoder[end_row, SPEECH_CHANNEL] = SPEECH_LOGIT_WEIGHT[preset] + extra
    decoder[end_row, LENGTH_CHANNEL] = length
    return decoder


def qwen2lm_state_dict(preset: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """`llm.pt`: Qwen2LM's state_dict in fp32, keys in module order; lm_head shares embed_tokens (tied)."""
    h = _hidden(preset)
    body = counting_qwen2(preset, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    speech_embedding = speech_rows(SPEECH_HEAD_ROWS, h, gen)
    llm_embedding = other_rows(LLM_EMBEDDING_ROWS, h, gen)
    decoder = speech_head(SPEECH_HEAD_ROWS, cv.SPEECH_TOKEN_COUNT, h, gen, preset)
    state = {"llm_embedding.weight": llm_embedding}
    state.update({f"llm.model.{k}": v for k, v in body.items()})
    state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]
    state["llm_decoder.weight"] = decoder
    state["llm_decoder.bias"] = torch.randn(SPEECH_HEAD_ROWS, generator=gen) * 0.01
    state["speech_embedding.weight"] = speech_embedding
    return state


def blank_en_state_dict(qwen2lm: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CosyVoice-BlankEN/model.safetensors: the Qwen2 of `qwen2lm`, tied (no lm_head), in bf16."""
    prefix = "llm.model."
    return {
        k.removeprefix(prefix): v.to(BLANK_EN_DTYPE)
        for k, v in qwen2lm.items()
        if k.startswith(prefix + "model.")
    }


def hf_state_dict(qwen2lm: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    """cosyvoice2_llm's weights from an llm.pt state_dict, as pretrained_to_huggingface.py maps them."""
    embed = qwen2lm["llm.model.model.embed_tokens.weight"]
    h = embed.shape[1]
    gen = torch.Generator().manual_seed(seed + 2)
    embed_tokens = other_rows(cv.LLM_VOCAB_SIZE, h, gen)
    embed_tokens[: cv.QWEN2_VOCAB_SIZE] = embed
    speech = slice(cv.ORIGINAL_VOCAB_SIZE, cv.ORIGINAL_VOCAB_SIZE + SPEECH_HEAD_ROWS)
    embed_tokens[speech] = qwen2lm["speech_embedding.weight"]
    embed_tokens[speech.stop : speech.stop + LLM_EMBEDDING_ROWS] = qwen2lm["llm_embedding.weight"]
    lm_head = torch.zeros(cv.LLM_VOCAB_SIZE, h)
    lm_head[speech] = qwen2lm["llm_decoder.weight"]
    state = blank_en_state_dict(qwen2lm)
    state["model.embed_tokens.weight"] = embed_tokens
    state["lm_head.weight"] = lm_head
    return {k: v.to(LLM_DTYPE) for k, v in state.items()}


def blank_en_config(preset: str) -> dict:
    ids = {"bos_token_id": cv.BLANK_EN_ADDED_BASE, "eos_token_id": cv.BLANK_EN_ADDED_BASE}
    return qwen2_config(preset, cv.QWEN2_VOCAB_SIZE, BLANK_EN_DTYPE) | ids


def llm_config(preset: str) -> dict:
    end_id = cv.ORIGINAL_VOCAB_SIZE + cv.SPEECH_TOKEN_COUNT
    config = qwen2_config(preset, cv.LLM_VOCAB_SIZE, LLM_DTYPE)
    return config | {
        "bos_token_id": cv.BLANK_EN_ADDED_BASE,
        "eos_token_id": end_id,
        "tie_word_embeddings": False,
    }


def llm_generation_config() -> dict:
    stops = [cv.ORIGINAL_VOCAB_SIZE + cv.SPEECH_TOKEN_COUNT + i for i in range(len(cv.SPEECH_STOP_TOKENS))]
    base = generation_config() | {"bos_token_id": cv.BLANK_EN_ADDED_BASE}
    return base | {"eos_token_id": stops, "temperature": 1.0, "top_k": 25, "top_p": 0.8}


def llm_added_tokens() -> list[AddedToken]:
    """Text specials are special tokens (add_special_tokens); speech and the five after them are not (add_tokens)."""
    text = set(cv.text_added_tokens())
    return [AddedToken(cv.BLANK_EN_ADDED_BASE + i, t, t in text) for i, t in enumerate(cv.llm_added_tokens())]


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_llm_pt(path: str | Path, qwen2lm: dict[str, torch.Tensor]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(qwen2lm, str(path))
    return path


def write_blank_en(out_dir: str | Path, preset: str, qwen2lm: dict[str, torch.Tensor]) -> Path:
    """config.json, generation_config.json, model.safetensors and the slow tokenizer files (no tokenizer.json)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", blank_en_config(preset))
    generation = {"bos_token_id": cv.BLANK_EN_ADDED_BASE, "eos_token_id": cv.BLANK_EN_ADDED_BASE}
    _write_json(out_dir / "generation_config.json", generation | {"max_new_tokens": 2048})
    write_weights(blank_en_state_dict(qwen2lm), out_dir, None)
    added = [AddedToken(cv.BLANK_EN_ADDED_BASE + i, t, True) for i, t in enumerate(cv.BLANK_EN_ADDED_TOKENS)]
    write_qwen2_tokenizer(out_dir, added, BLANK_EN_SPECIAL, slow_files_only=True)
    return out_dir


def write_cosyvoice2_llm(
    out_dir: str | Path, preset: str, qwen2lm: dict[str, torch.Tensor], seed: int
) -> Path:
    """The Hugging Face directory the Triton runtime serves: config, weights, tokenizer, generation config."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = llm_config(preset)
    assert config["torch_dtype"] == DTYPE_NAMES[LLM_DTYPE]
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", llm_generation_config())
    write_weights(hf_state_dict(qwen2lm, seed), out_dir, None)
    write_qwen2_tokenizer(out_dir, llm_added_tokens(), LLM_SPECIAL, chat_template=CHAT_TEMPLATE)
    return out_dir
