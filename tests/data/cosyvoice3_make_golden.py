"""Run upstream's CosyVoice3 code ONCE on our synthetic files; store its outputs for the parity tests.

Not a test and not part of the package: it documents how `cosyvoice3_golden.npz` and `cosyvoice3_keys.json`
were made. Upstream: FunAudioLLM/CosyVoice @ace7c47 (`cosyvoice/`), its Matcha-TTS submodule @dd9105b
(`matcha/`), x-transformers==2.11.24 (upstream's pin), hyperpyyaml, omegaconf, einops. Modules that upstream
only imports on these code paths (training loggers, the conformer/diffusers decoders of CosyVoice 1, torchaudio's
kaldi fbank, ...) are not installed here and are replaced by empty import stubs; nothing of theirs runs.

    UPSTREAM=/tmp/i20_up  # cosyvoice/ + matcha/ extracted from the two commits
    PYTHONPATH=$PWD:/tmp/i20_uppkgs_x:/tmp/i20_uppkgs:$UPSTREAM python tests/data/cosyvoice3_make_golden.py

What it checks on the way (the reverse direction): upstream's `load_hyperpyyaml` builds its modules from our
`cosyvoice3.yaml` and loads our `flow.pt` / `hift.pt` with `strict=True` (tiny and full presets); the full
preset's key names and shapes, in upstream's order, go to `cosyvoice3_keys.json`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch

STUBBED = ("conformer", "diffusers", "lightning", "hydra", "rich", "rootutils", "gdown", "wget", "torchaudio",
           "matplotlib", "matcha.data", "matcha.utils.instantiators", "matcha.utils.logging_utils",
           "matcha.utils.rich_utils", "matcha.utils.utils", "matcha.models.components.decoder",
           "matcha.models.components.transformer", "whisper", "tiktoken")  # fmt: skip


class _Stub(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if any(fullname == s or fullname.startswith(s + ".") for s in STUBBED):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _StubFinder())

from hyperpyyaml import load_hyperpyyaml  # noqa: E402

from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav  # noqa: E402
from tritontts.synthetic.cosyvoice3_llm import write_cosyvoice3_llm_files  # noqa: E402

DATA = Path(__file__).parent
NOISE_HEAD = 1200
HIFT_FRAMES = 40
NOISE_FAR = 2_000_000  # a slice this far in: the replayed draws stay in step over millions of samples


def upstream_modules(model_dir: Path):
    with open(model_dir / "cosyvoice3.yaml") as f:
        configs = load_hyperpyyaml(f, overrides={"llm": None, "get_tokenizer": None})
    flow, hift = configs["flow"], configs["hift"]
    flow.load_state_dict(
        torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True), strict=True
    )
    hift.load_state_dict(
        torch.load(model_dir / "hift.pt", map_location="cpu", weights_only=True), strict=True
    )
    return flow.eval(), hift.eval()


LLM_REFERENCE_TEXT = "You are a helpful assistant.<|endofprompt|>Hello there, [breath] nice to meet you."
LLM_TARGET_TEXT = " 八百标兵奔北坡 [laughter] ok"


def upstream_llm(model_dir: Path) -> dict[str, np.ndarray]:
    """CosyVoice3LM built from the yaml around our BlankEN, llm.pt loaded strictly; the first decoding step's
    logits for a prompt, and the text ids its tokenizer gives."""
    with open(model_dir / "cosyvoice3.yaml") as f:
        configs = load_hyperpyyaml(f, overrides={"qwen_pretrain_path": str(model_dir / "CosyVoice-BlankEN"),
                                                 "flow": None, "hift": None})  # fmt: skip
    llm = configs["llm"].float()  # transformers 5 loads BlankEN in its bf16; upstream's pinned 4.51 in fp32
    llm.load_state_dict(torch.load(model_dir / "llm.pt", map_location="cpu", weights_only=True), strict=True)
    llm.eval()
    tokenizer = configs["get_tokenizer"]()
    text_ids = tokenizer.encode(LLM_REFERENCE_TEXT + LLM_TARGET_TEXT, allowed_special="all")
    prompt_speech = torch.arange(40, 60, dtype=torch.int64)[None]
    with torch.inference_mode():
        text_emb = llm.llm.model.model.embed_tokens(torch.tensor([text_ids]))
        sos = llm.speech_embedding.weight[llm.sos].reshape(1, 1, -1)
        task = llm.speech_embedding.weight[llm.task_id].reshape(1, 1, -1)
        lm_input = torch.cat([sos, text_emb, task, llm.speech_embedding(prompt_speech)], dim=1)
        masks = torch.tril(torch.ones((1, lm_input.shape[1], lm_input.shape[1]))).to(torch.bool)
        hidden, _ = llm.llm.forward_one_step(lm_input, masks=masks, cache=None)
        logits = llm.llm_decoder(hidden[:, -1])
    return {"llm_text_ids": np.asarray(text_ids, dtype=np.int64), "llm_prompt_speech": prompt_speech[0].numpy(),
            "llm_logits": logits[0].numpy()}  # fmt: skip


def keys_of(module: torch.nn.Module) -> list[list]:
    return [[k, list(v.shape)] for k, v in module.state_dict().items()]


def main() -> None:
    torch.set_num_threads(1)
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        full_dir = write_cosyvoice3_token2wav(Path(tmp) / "full", "full", seed=0)
        flow, hift = upstream_modules(full_dir)
        keys = {"flow": keys_of(flow), "hift": keys_of(hift)}
        (DATA / "cosyvoice3_keys.json").write_text(json.dumps(keys) + "\n")
        del flow, hift

        model_dir = write_cosyvoice3_token2wav(Path(tmp) / "tiny", "tiny", seed=0)
        flow, hift = upstream_modules(model_dir)
        out.update(upstream_llm(write_cosyvoice3_llm_files(model_dir, "tiny", seed=0, length_counter=False)))
    sine_noise = hift.m_source.l_sin_gen.sine_waves
    out["source_noise_head"] = sine_noise[0, :NOISE_HEAD].numpy()
    out["source_noise_far"] = sine_noise[0, NOISE_FAR : NOISE_FAR + NOISE_HEAD].numpy()

    gen = torch.Generator().manual_seed(20)
    prompt_tokens = torch.randint(0, 6561, (1, 12), generator=gen, dtype=torch.int32)
    tokens = torch.randint(0, 6561, (1, 60), generator=gen, dtype=torch.int32)
    prompt_feat = torch.randn(1, 24, 80, generator=gen)
    embedding = torch.randn(1, 192, generator=gen)
    out.update(prompt_tokens=prompt_tokens[0].numpy(), tokens=tokens[0].numpy(),
               prompt_feat=prompt_feat[0].numpy(), embedding=embedding[0].numpy())  # fmt: skip

    def flow_call(n: int, finalize: bool) -> torch.Tensor:
        part = tokens[:, :n]
        mel, _ = flow.inference(part, torch.tensor([n]), prompt_tokens, torch.tensor([12]), prompt_feat,
                                torch.tensor([24]), embedding, streaming=not finalize, finalize=finalize)  # fmt: skip
        return mel

    out["flow_offline"] = flow_call(60, True)[0].numpy()
    # upstream's BLS schedule: 15 + 3 look-ahead, then 25 + 3, then the rest finalized (streaming off)
    for n, finalize in ((18, False), (43, False), (60, True)):
        out[f"flow_stream_{n}"] = flow_call(n, finalize)[0].numpy()

    # the estimator alone, streaming mask, one call
    x = torch.randn(2, 80, 70, generator=gen)
    mu = torch.randn(2, 80, 70, generator=gen)
    cond = torch.randn(2, 80, 70, generator=gen)
    spks = torch.randn(2, 80, generator=gen)
    t = torch.rand(2, generator=gen)
    mask = torch.ones(2, 1, 70)
    mask[1, :, 55:] = 0
    for name, value in dict(dit_x=x, dit_mu=mu, dit_cond=cond, dit_spks=spks, dit_t=t, dit_mask=mask).items():
        out[name] = value.numpy()
    with torch.inference_mode():
        for streaming in (False, True):
            v = flow.decoder.estimator(x, mask, mu, t, spks, cond, streaming=streaming)
            out[f"dit_out_{'stream' if streaming else 'full'}"] = v.numpy()

    mel = torch.from_numpy(out["flow_offline"])[None, :, :HIFT_FRAMES].contiguous()
    with torch.inference_mode():
        hift.f0_predictor.to(torch.float64)
        for finalize in (True, False):
            tag = "final" if finalize else "partial"
            f0 = hift.f0_predictor(mel.double(), finalize=finalize).to(mel)
            s = hift.f0_upsamp(f0[:, None]).transpose(1, 2)
            s, _, _ = hift.m_source(s)
            s = s.transpose(1, 2)
            feat = mel if finalize else mel[:, :, : -hift.f0_predictor.condnet[0].causal_padding]
            out[f"hift_f0_{tag}"] = f0[0].numpy()
            out[f"hift_source_{tag}"] = s[0, 0].numpy()
            out[f"hift_decode_{tag}"] = hift.decode(x=feat, s=s, finalize=finalize)[0].numpy()
            out[f"hift_speech_{tag}"] = hift.inference(mel, finalize=finalize)[0][0].numpy()

    from matcha.utils.audio import mel_spectrogram

    wav = torch.sin(torch.arange(24000 * 1.3) * 2 * np.pi * 220 / 24000)[None] * 0.5
    wav = wav + 0.05 * torch.randn(wav.shape, generator=gen)
    out["prompt_wav_24k"] = wav[0].numpy()
    feat = mel_spectrogram(wav, n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480, win_size=1920,
                           fmin=0, fmax=None, center=False)  # fmt: skip
    out["prompt_mel"] = feat[0].numpy()
    np.savez_compressed(DATA / "cosyvoice3_golden.npz", **out)
    print({k: v.shape for k, v in out.items()})


if __name__ == "__main__":
    main()
