"""Random CosyVoice3 LLM weights: `llm.pt` (upstream's CosyVoice3LM state_dict) and `CosyVoice-BlankEN/`.

The HF directory the runtime serves is made from these two by `tritontts.cosyvoice3.convert`, as upstream's
runtime makes `hf_cosyvoice3_llm` from the hub files. The network "speaks" as CosyVoice2's synthetic LLM does
(hidden channel 0, see synthetic.qwen2): `llm_decoder` weighs that channel positively for the 6561 speech rows,
a little less for `<|eos1|>` (so speech ends now and then), negatively for the other reserved rows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tritontts.cosyvoice2 import tokens as cv2
from tritontts.cosyvoice3 import tokens as cv3
from tritontts.synthetic.cosyvoice2_llm import (
    EMBED_STD,
    END_LOGIT_WEIGHT,
    SPEECH_CHANNEL_INPUT,
    SPEECH_LOGIT_WEIGHT,
    TEXT_CHANNEL_INPUT,
    write_blank_en,
    write_llm_pt,
)
from tritontts.synthetic.presets import preset_entry
from tritontts.synthetic.qwen2 import PRESETS, qwen2_state_dict

END_ROW = cv3.SPEECH_TOKEN_COUNT + 1  # <|eos1|>
CONTROL_ROWS = (cv3.SPEECH_TOKEN_COUNT, cv3.SPEECH_TOKEN_COUNT + 2)  # sos, task_id: LLM inputs


def cosyvoice3lm_state_dict(preset: str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """`llm.pt`: CosyVoice3LM's state_dict in fp32 (Qwen2 with tied lm_head, speech_embedding, llm_decoder)."""
    h = preset_entry(PRESETS, preset).hidden_size
    body = qwen2_state_dict(preset, seed, cv2.QWEN2_VOCAB_SIZE, torch.float32, speech_tokens=(0, 0))
    gen = torch.Generator().manual_seed(seed + 1)
    speech_embedding = torch.randn(cv3.SPEECH_VOCAB, h, generator=gen) * EMBED_STD
    speech_embedding[:, 0] = SPEECH_CHANNEL_INPUT
    for row in CONTROL_ROWS:
        speech_embedding[row, 0] = TEXT_CHANNEL_INPUT
    decoder = torch.randn(cv3.SPEECH_VOCAB, h, generator=gen) * EMBED_STD
    decoder[: cv3.SPEECH_TOKEN_COUNT, 0] = SPEECH_LOGIT_WEIGHT[preset]
    decoder[cv3.SPEECH_TOKEN_COUNT :, 0] = -SPEECH_LOGIT_WEIGHT[preset]
    decoder[END_ROW, 0] = END_LOGIT_WEIGHT[preset]
    state = {f"llm.model.{k}": v for k, v in body.items()}
    state["llm.model.lm_head.weight"] = state["llm.model.model.embed_tokens.weight"]
    state["llm_decoder.weight"] = decoder
    state["speech_embedding.weight"] = speech_embedding
    return state


def write_cosyvoice3_llm_files(model_dir: str | Path, preset: str = "tiny", seed: int = 0) -> Path:
    """`llm.pt` and `CosyVoice-BlankEN/` into `model_dir`."""
    model_dir = Path(model_dir)
    state = cosyvoice3lm_state_dict(preset, seed)
    write_llm_pt(model_dir / "llm.pt", state)
    write_blank_en(model_dir / "CosyVoice-BlankEN", preset, state)
    return model_dir
