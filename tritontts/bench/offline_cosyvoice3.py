"""CosyVoice3 in one process: front end (speech tokenizer v3, 24 kHz prompt mel with fmax 12 kHz, CAMPPlus) → LLM
(`hf_cosyvoice3_llm/`, any backend of `offline_llm`, or the `openai` chat endpoint) → DiT flow → causal HiFT,
batch by batch; CosyVoice2's pipeline with CosyVoice3's prompt (the system part upstream's BLS prefixes) and
token2wav. Token2wav runs one row at a time (offline), as upstream's `token2wav_batch_size=1`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tritontts.bench.dataset import Utterance
from tritontts.bench.offline_cosyvoice2 import CosyVoice2Pipeline, frontend_device, llm_side, require_folders
from tritontts.bench.offline_cosyvoice2_prompt import SpeechPrompt
from tritontts.bench.offline_settings import OfflineSettings
from tritontts.cosyvoice2.frontend import INPUT_SAMPLE_RATE, CosyVoice2Frontend, PromptFeatures
from tritontts.cosyvoice3.flow import Flow3, load_flow3
from tritontts.cosyvoice3.frontend import cosyvoice3_frontend
from tritontts.cosyvoice3.hift import CausalHiFT, load_causal_hift
from tritontts.cosyvoice3.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice3.prompt import CosyVoice3Prompt, with_system_prompt
from tritontts.devices import resolve_flow_dtype


class CosyVoice3Token2Wav:
    def __init__(self, frontend: CosyVoice2Frontend, flow: Flow3, hift: CausalHiFT) -> None:
        self.frontend = frontend
        self.flow = flow
        self.hift = hift

    def voice(self, wav_16k: np.ndarray) -> PromptFeatures:
        return self.frontend(wav_16k)

    def vocode(self, tokens: list[int], voice: PromptFeatures) -> np.ndarray:
        prompt = torch.from_numpy(voice.speech_tokens[None])
        feat = torch.from_numpy(voice.speech_feat[None])
        with torch.inference_mode():
            mel = self.flow.inference(
                torch.tensor([tokens], dtype=torch.int32), torch.tensor([len(tokens)]), prompt,
                torch.tensor([prompt.shape[1]]), feat, torch.tensor([feat.shape[1]]),
                torch.from_numpy(voice.spk_embedding[None]), streaming=False, finalize=True,
            )  # fmt: skip
            audio, _ = self.hift.inference(mel.float(), finalize=True)
        return audio[0].float().cpu().numpy()

    def forget_voices(self) -> None:
        pass


class CosyVoice3Pipeline(CosyVoice2Pipeline):
    def _prompt(self, row: Utterance, voice: Any) -> SpeechPrompt:
        tokens = np.asarray(voice.speech_tokens, dtype=np.int32)
        reference = with_system_prompt(row.prompt_text)
        ids = self.prompter.input_ids(reference, row.target_text, tokens)
        return SpeechPrompt(reference, row.target_text, tokens, np.asarray(ids, dtype=np.int32))


def create_pipeline(
    settings: OfflineSettings, rows: Sequence[Utterance], device: torch.device
) -> tuple[CosyVoice3Pipeline, int, dict]:
    """The pipeline, the rate its reference audio is read at, and what the report says about its dtypes."""
    root = Path(settings.model_dir)
    require_folders(root, (MODEL_DIR, LLM_DIR), "run.sh stage 0 writes both")
    llm = llm_side(settings, rows, device, LLM_DIR, CosyVoice3Prompt)
    flow_dtype = resolve_flow_dtype(settings.token2wav_dtype, device)
    model_dir = root / MODEL_DIR
    token2wav = CosyVoice3Token2Wav(
        cosyvoice3_frontend(model_dir, tokenizer_device=frontend_device(device)),
        load_flow3(model_dir, device=device, dtype=flow_dtype),
        load_causal_hift(model_dir, device=device),
    )
    extra = {"token2wav_dtype": str(flow_dtype).removeprefix("torch."), "hift_dtype": "float32"}
    pipeline = CosyVoice3Pipeline(llm.prompter, llm.generate, token2wav, device, llm.max_seq_len)
    return pipeline, INPUT_SAMPLE_RATE, {**llm.report, **extra}
