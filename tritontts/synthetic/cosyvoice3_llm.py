"""Random CosyVoice3 LLM weights: `llm.pt` (upstream's CosyVoice3LM state_dict) and `CosyVoice-BlankEN/`.

The HF directory the runtime serves is made from these two by `tritontts.cosyvoice3.convert`, as upstream's
runtime makes `hf_cosyvoice3_llm` from the hub files. The network "speaks" and stops as CosyVoice2's synthetic LLM
does, built by the same functions (tritontts.synthetic.cosyvoice2_llm): the Qwen2 body carries the length counter
over the text, the 6561 speech rows of `speech_embedding` are speech rows (weight 0), its 200 reserved rows
(sos and task_id are the ones the LLM reads) are text-like (weight 1), and `llm_decoder` reads the speech channel
positively for speech, negatively for the reserved rows except `<|eos1|>`, which ends speech once the speech tokens
in the context cover the text at 25 tokens/s (tritontts.synthetic.length_counter).

`length_counter=False` gives the earlier construction, without the counter (a fixed `<|eos1|>` weight, so speech
ends at random): the weights that `tests/data/cosyvoice3_golden.npz`'s upstream logits were computed from.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tritontts.cosyvoice2 import tokens as cv2
from tritontts.cosyvoice3 import tokens as cv3
from tritontts.synthetic.cosyvoice2_llm import (
    EMBED_STD,
    SPEECH_CHANNEL_INPUT,
    SPEECH_LOGIT_WEIGHT,
    TEXT_CHANNEL_INPUT,
    counting_qwen2,
    other_rows,
    speech_head,
    speech_rows,
    write_blank_en,
    write_llm_pt,
)
from tritontts.synthetic.presets import preset_entry
from tritontts.synthetic.qwen2 import PRESETS, qwen2_state_dict

END_ROW = cv3.SPEECH_TOKEN_COUNT + 1  # <|eos1|>
RESERVED_ROWS = cv3.SPEECH_VOCAB - cv3.SPEECH_TOKEN_COUNT
CONTROL_ROWS = (cv3.SPEECH_TOKEN_COUNT, cv3.SPEECH_TOKEN_COUNT + 2)  # sos, task_id: LLM inputs
# Without the counter: <|eos1|>'s weight on the speech channel (calibrated so speech ends now and then).
UNCOUNTED_END_WEIGHT = {"tiny": 0.118, "full": 0.76}


def _uncounted(preset: str, seed: int, h: int) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    body = qwen2_state_dict(preset, seed, cv2.QWEN2_VOCAB_SIZE, torch.float32, speech_tokens=(0, 0))
    gen = torch.Generator().manual_seed(seed + 1)
    speech_embedding = torch.randn(cv3.SPEECH_VOCAB, h, generator=gen) * EMBED_STD
    speech_embedding[:, 0] = SPEECH_CHANNEL_INPUT
    for row in CONTROL_ROWS:
        speech_embedding[row, 0] = TEXT_CHANNEL_INPUT
    decoder = torch.randn(cv3.SPEECH_VOCAB, h, generator=gen) * EMBED_STD
    decoder[: cv3.SPEECH_TOKEN_COUNT, 0] = SPEECH_LOGIT_WEIGHT[preset]
    decoder[cv3.SPEECH_TOKEN_COUNT :, 0] = -SPEECH_LOGIT_WEIGHT[preset]
    decoder[END_ROW, 0] = UNCOUNTED_END_WEIGHT[preset]
    return body, speech_embedding, decoder


def cosyvoice3lm_state_dict(
    preset: str = "tiny", seed: int = 0, length_counter: bool = True
) -> dict[str, torch.Tensor]:
    """`llm.pt`: CosyVoice3LM's state_dict in fp32 (Qwen2 with tied lm_head, speech_embedding, llm_decoder)."""
    h = preset_entry(PRESETS, preset).hidden_size
    if length_counter:
        body = counting_qwen2(preset, seed)
        gen = torch.Generator().manual_seed(seed + 1)
        speech_embedding = torch.cat(
            [speech_rows(cv3.SPEECH_TOKEN_COUNT, h, gen), other_rows(RESERVED_ROWS, h, gen)]
        )
        decoder = speech_head(cv3.SPEECH_VOCAB, END_ROW, h, gen, preset)
    else:
        body, speech_embedding, decoder = _uncounted(preset, seed, h)
    state = {f"llm.model.{k}": v for k, v in body.items()}
    state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]
    state["llm_decoder.weight"] = decoder
    state["speech_embedding.weight"] = speech_embedding
    return state


def write_cosyvoice3_llm_files(
    model_dir: str | Path, preset: str = "tiny", seed: int = 0, length_counter: bool = True
) -> Path:
    """`llm.pt` and `CosyVoice-BlankEN/` into `model_dir`."""
    model_dir = Path(model_dir)
    state = cosyvoice3lm_state_dict(preset, seed, length_counter)
    write_llm_pt(model_dir / "llm.pt", state)
    write_blank_en(model_dir / "CosyVoice-BlankEN", preset, state)
    return model_dir
