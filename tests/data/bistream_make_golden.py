"""Run upstream's `Qwen2LM.inference_bistream` ONCE on our tiny synthetic LLMs; store its tokens for the parity test.

Not a test and not part of the package: it documents how `bistream_golden.json` was made. Upstream:
FunAudioLLM/CosyVoice @ace7c47 (`cosyvoice/`, extracted with `git archive HEAD cosyvoice`), run with this
venv's torch and transformers; only the modules `cosyvoice.llm.llm` imports are needed, and `torchaudio`, which
two of them import without using it here, is stubbed by empty modules. Upstream's LLM classes are built directly (the
arguments our synthetic yaml gives them: speech_token_size 6561, mix_ratio [5, 15]) around our synthetic BlankEN,
and `llm.pt` is loaded with strict=True.

    git --git-dir=/work/.mirror/FunAudioLLM+CosyVoice/repo archive HEAD cosyvoice | tar -x -C /tmp/bs_up
    PYTHONPATH=$PWD:/tmp/bs_up python tests/data/bistream_make_golden.py

What differs from a plain upstream run, and why:
- sampling is greedy (`self.sampling` is argmax), so that the tokens are a fixed function of the weights;
- CosyVoice2: the served `cosyvoice2_llm` holds llm.pt in bf16 without `llm_decoder`'s bias (as upstream's
  pretrained_to_huggingface.py makes it), so upstream runs those same weights (rounded to bf16, bias zero);
  CosyVoice3: the served directory is converted from llm.pt in float32, so upstream runs llm.pt as it is;
- transformers 5's DynamicCache has no `cache[0][0]` (upstream's pin, 4.51, has): a `__getitem__` returning
  (keys, values) of a layer stands in;
- the text generator yields one token id per iteration, as upstream's frontend does; the final phase (after
  the text) is cut after `FINAL_TOKENS` tokens unless `<|eos1|>` comes first.
A case where upstream raises (a special token sampled inside a segment) is not stored: none did with these.
"""

from __future__ import annotations

import json
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import DynamicCache

from tritontts.synthetic.cosyvoice2_llm import qwen2lm_state_dict, write_blank_en, write_cosyvoice2_llm
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files

DATA = Path(__file__).parent
SEED = 0
FINAL_TOKENS = 40
SPEECH_TOKENS = 6561
PROMPT_TEXT = "Hello there, nice to meet you."
CV3_SYSTEM = "You are a helpful assistant.<|endofprompt|>"
TEXTS = {
    "long": "The quick brown fox jumps over the lazy dog, and then it runs far away into the green forest "
    "where nobody can find it again.",
    "medium": "A short sentence about the weather, which is rather nice today.",
    "short": "Ok.",
}
# name: (text, prompt speech length, delta sizes cycled over the text's ids)
CASES = {
    "p30_long_single": ("long", 30, (1,)),
    "p22_medium_mixed": ("medium", 22, (3, 1, 4)),
    "p45_short_leftover": ("short", 45, (2,)),
    "p0_long_mixed": ("long", 0, (2, 5, 1)),
}


def _cache_item(self: DynamicCache, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    layer = self.layers[index]
    return layer.keys, layer.values


DynamicCache.__getitem__ = _cache_item


def deltas_of(ids: list[int], sizes: tuple[int, ...]) -> list[list[int]]:
    out, start, turn = [], 0, 0
    while start < len(ids):
        size = sizes[turn % len(sizes)]
        out.append(ids[start : start + size])
        start, turn = start + size, turn + 1
    return out


def greedy(weighted_scores: torch.Tensor, decoded_tokens: list, sampling: int) -> int:
    return int(weighted_scores.argmax())


def upstream_lm(family: str, model_dir: Path, blank_en: Path):
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        sys.modules.setdefault(name, types.ModuleType(name))  # after transformers looked for torchaudio
    from cosyvoice.llm.llm import CosyVoice3LM, Qwen2Encoder, Qwen2LM

    encoder = Qwen2Encoder(str(blank_en))
    hidden = encoder.model.config.hidden_size
    cls = Qwen2LM if family == "cosyvoice2" else CosyVoice3LM
    lm = cls(hidden, hidden, SPEECH_TOKENS, encoder, greedy, mix_ratio=[5, 15]).float()
    state = torch.load(model_dir / "llm.pt", map_location="cpu", weights_only=True)
    if family == "cosyvoice2":
        state = {k: v.to(torch.bfloat16).float() for k, v in state.items()}
        state["llm_decoder.bias"] = torch.zeros_like(state["llm_decoder.bias"])
    lm.load_state_dict(state, strict=True)
    return lm.eval()


def run_upstream(lm, prompt_text: list[int], speech: list[int], text: list[int]) -> list[int]:
    exhausted = [False]

    def text_tokens() -> Iterator[torch.Tensor]:
        for token in text:
            yield torch.tensor([[token]], dtype=torch.int64)
        exhausted[0] = True

    speech_t = torch.tensor([speech], dtype=torch.int64).reshape(1, -1)
    prompt_t = torch.tensor([prompt_text], dtype=torch.int64)
    out, final = [], 0
    stream = lm.inference_bistream(text_tokens(), prompt_t, torch.tensor([len(prompt_text)]), speech_t,
                                   torch.tensor([len(speech)]), torch.zeros(1, 192))  # fmt: skip
    for token in stream:
        out.append(int(token))
        final += exhausted[0]
        if final == FINAL_TOKENS:
            stream.close()
            break
    return out


def family_cases(family: str, lm, tokenizer: Tokenizer) -> dict:
    gen = torch.Generator().manual_seed(SEED)
    prefix = CV3_SYSTEM if family == "cosyvoice3" else ""
    prompt_text = tokenizer.encode(prefix + PROMPT_TEXT, add_special_tokens=False).ids
    cases = {}
    for name, (text_name, speech_len, sizes) in CASES.items():
        speech = torch.randint(0, SPEECH_TOKENS, (speech_len,), generator=gen).tolist()
        text = tokenizer.encode(" " + TEXTS[text_name], add_special_tokens=False).ids
        with torch.inference_mode():
            tokens = run_upstream(lm, prompt_text, speech, text)
        cases[name] = {"prompt_text_ids": prompt_text, "prompt_speech": speech,
                       "deltas": deltas_of(text, sizes), "tokens": tokens}  # fmt: skip
        print(family, name, len(text), "text ids,", len(tokens), "speech tokens")
    return cases


def main() -> None:
    torch.set_num_threads(1)
    golden = {"seed": SEED, "final_tokens": FINAL_TOKENS, "families": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        qwen2lm = qwen2lm_state_dict("tiny", SEED)
        torch.save(qwen2lm, root / "llm.pt")
        write_cosyvoice2_llm(root / "cv2" / "cosyvoice2_llm", "tiny", qwen2lm, SEED)
        write_blank_en(root / "cv2_blank_en", "tiny", qwen2lm)
        tokenizer = Tokenizer.from_file(str(root / "cv2" / "cosyvoice2_llm" / "tokenizer.json"))
        lm = upstream_lm("cosyvoice2", root, root / "cv2_blank_en")
        golden["families"]["cosyvoice2"] = family_cases("cosyvoice2", lm, tokenizer)

        cv3_dir = write_cosyvoice3_token2wav(root / "cv3", "tiny", SEED)
        write_cosyvoice3_llm_files(cv3_dir, "tiny", SEED)
        lm = upstream_lm("cosyvoice3", cv3_dir, cv3_dir / "CosyVoice-BlankEN")
        golden["families"]["cosyvoice3"] = family_cases("cosyvoice3", lm, tokenizer)
    (DATA / "bistream_golden.json").write_text(json.dumps(golden, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
