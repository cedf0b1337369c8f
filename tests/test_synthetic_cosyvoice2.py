import hashlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tolerance import max_error, within

from tritontts.checkpoint import read_state_dict
from tritontts.cosyvoice2 import tokens as cv
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.llm.engine import LLMEngine
from tritontts.llm.kv_cache import KVCache
from tritontts.llm.loader import load_pretrained
from tritontts.synthetic.cosyvoice2_llm import (
    llm_config,
    qwen2lm_state_dict,
    write_blank_en,
    write_cosyvoice2_llm,
    write_llm_pt,
)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "make_synthetic_checkpoint.py"
PROMPT_WAV = REPO.parent / "shared" / "data" / "prompt_zh.wav"
REFERENCE = "吃燕窝就选燕之屋，本节目由26年专注高品质燕窝的燕之屋冠名播出。"
TARGET = "身临其境，换新体验。"
SPEECH_TOKEN_SIZE = 6561  # cosyvoice2.yaml: llm.speech_token_size


def _write_llm_parts(out: Path, seed: int) -> Path:
    qwen2lm = qwen2lm_state_dict("tiny", seed)
    write_llm_pt(out / "llm.pt", qwen2lm)
    write_blank_en(out / "CosyVoice-BlankEN", "tiny", qwen2lm)
    write_cosyvoice2_llm(out / "cosyvoice2_llm", "tiny", qwen2lm, seed)
    return out


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in directory.rglob("*.*")
    }


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    return _write_llm_parts(tmp_path_factory.mktemp("cv2"), seed=0)


@pytest.fixture(scope="module")
def prompt_ids(parts) -> list[int]:
    speech = torch.randint(0, cv.SPEECH_TOKEN_COUNT, (40,), generator=torch.Generator().manual_seed(0))
    return CosyVoice2Prompt.from_llm_dir(parts / "cosyvoice2_llm").input_ids(
        REFERENCE, TARGET, speech.tolist()
    )


def qwen2lm_shapes(qwen: dict, llm_input_size: int, llm_output_size: int) -> dict[str, tuple[int, ...]]:
    """Qwen2LM's state_dict from cosyvoice/llm/llm.py: llm_embedding (sos, task_id), the Qwen2 with its
    tied lm_head under llm.model, llm_decoder and speech_embedding over speech_token_size + 3."""
    h, kv = (
        qwen["hidden_size"],
        qwen["hidden_size"] // qwen["num_attention_heads"] * qwen["num_key_value_heads"],
    )
    ff, rows = qwen["intermediate_size"], SPEECH_TOKEN_SIZE + 3
    shapes = {
        "llm_embedding.weight": (2, llm_input_size),
        "llm.model.model.embed_tokens.weight": (qwen["vocab_size"], h),
    }
    for i in range(qwen["num_hidden_layers"]):
        p = f"llm.model.model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h),
            p + "self_attn.q_proj.bias": (h,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (ff, h),
            p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes | {
        "llm.model.model.norm.weight": (h,),
        "llm.model.lm_head.weight": (qwen["vocab_size"], h),
        "llm_decoder.weight": (rows, llm_output_size),
        "llm_decoder.bias": (rows,),
        "speech_embedding.weight": (rows, llm_input_size),
    }


def test_llm_pt_has_the_qwen2lm_layout(parts):
    state = torch.load(parts / "llm.pt", map_location="cpu", weights_only=True)
    qwen = json.loads((parts / "CosyVoice-BlankEN" / "config.json").read_text())
    expected = qwen2lm_shapes(qwen, 64, 64)
    assert list(state) == list(expected)
    assert {k: tuple(v.shape) for k, v in state.items()} == expected
    assert all(v.dtype == torch.float32 for v in state.values())
    lm_head, embed = state["llm.model.lm_head.weight"], state["llm.model.model.embed_tokens.weight"]
    assert lm_head.untyped_storage().data_ptr() == embed.untyped_storage().data_ptr()


def test_cosyvoice2_llm_is_llm_pt_converted(parts):
    qwen2lm = torch.load(parts / "llm.pt", map_location="cpu", weights_only=True)
    hf = read_state_dict(parts / "cosyvoice2_llm" / "model.safetensors")
    blank = read_state_dict(parts / "CosyVoice-BlankEN" / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in [*hf.values(), *blank.values()])
    assert "lm_head.weight" not in blank and "lm_head.bias" not in hf
    speech = slice(cv.ORIGINAL_VOCAB_SIZE, cv.ORIGINAL_VOCAB_SIZE + SPEECH_TOKEN_SIZE + 3)
    embed, head = hf["model.embed_tokens.weight"].float(), hf["lm_head.weight"].float()
    assert embed.shape == head.shape == (cv.LLM_VOCAB_SIZE, 64)

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.bfloat16().float()

    assert torch.equal(head[speech], bf16(qwen2lm["llm_decoder.weight"]))
    assert head[: speech.start].abs().sum() == 0 and head[speech.stop :].abs().sum() == 0
    assert torch.equal(embed[speech], bf16(qwen2lm["speech_embedding.weight"]))
    assert torch.equal(embed[speech.stop : speech.stop + 2], bf16(qwen2lm["llm_embedding.weight"]))
    assert torch.equal(
        embed[: speech.start], bf16(qwen2lm["llm.model.model.embed_tokens.weight"])[: speech.start]
    )
    for name, tensor in blank.items():
        if name != "model.embed_tokens.weight":
            assert torch.equal(hf[name], tensor) and torch.equal(
                tensor.float(), bf16(qwen2lm["llm.model." + name])
            )


def test_blank_en_tokenizer_with_cosyvoice2_specials_ends_at_the_offset(parts):
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(parts / "CosyVoice-BlankEN"))
    special = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
    tokenizer.add_special_tokens(special | {"additional_special_tokens": list(cv.COSYVOICE2_SPECIAL_TOKENS)})
    assert len(tokenizer) == cv.ORIGINAL_VOCAB_SIZE
    assert tokenizer.convert_tokens_to_ids("<|endofprompt|>") == 151646


def test_full_llm_config_has_the_real_dims():
    config = llm_config("full")
    expected = {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "vocab_size": 158336,
        "tie_word_embeddings": False,
        "eos_token_id": 158224,
        "torch_dtype": "bfloat16",
    }
    assert {k: config[k] for k in expected} == expected


def test_engine_generates_valid_speech_tokens(parts, prompt_ids):
    prompt = CosyVoice2Prompt.from_llm_dir(parts / "cosyvoice2_llm")
    engine = LLMEngine.from_pretrained(parts / "cosyvoice2_llm", "cpu", max_batch_size=4, max_seq_len=256)
    params = [replace(prompt.sampling_params(), max_tokens=24, seed=s) for s in range(4)]
    outputs = engine.generate([prompt_ids] * 4, params)
    speech = [prompt.speech_tokens(out) for out in outputs]
    assert all(0 <= t < cv.SPEECH_TOKEN_COUNT for tokens in speech for t in tokens)
    assert len({t for tokens in speech for t in tokens}) > 20
    assert len({tuple(tokens) for tokens in speech}) == 4


def _our_prefill_logits(model, ids: list[int]) -> torch.Tensor:
    model.init_rope(len(ids))
    cache = KVCache(model.config, 1, len(ids), torch.device("cpu"), torch.float32)
    with torch.inference_mode():
        positions = torch.arange(len(ids)).unsqueeze(0)
        return model(
            torch.tensor([ids]), positions, cache.k, cache.v, slice(0, 1), len(ids), last_only=False
        )[0]


@pytest.fixture(scope="module")
def hf_logits(parts, prompt_ids) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    path = str(parts / "cosyvoice2_llm")
    model = transformers.Qwen2ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([prompt_ids])).logits[0]


@pytest.mark.golden
def test_logits_match_transformers(parts, prompt_ids, hf_logits):
    ours = _our_prefill_logits(load_pretrained(parts / "cosyvoice2_llm", "cpu"), prompt_ids)
    within("logits over max |logit|", max_error(ours, hf_logits) / float(hf_logits.abs().max()), 1e-3)


def test_upstream_sampling_speaks_and_does_not_end_before_the_text_is_said(hf_logits):
    """Under the BLS's top-k 50 / top-p 0.95 / temperature 0.8, only speech tokens can be drawn after the
    reference's 40 speech tokens: far fewer than the prompt's text takes to say (25 tokens/s), so `<|eos1|>`
    has next to no probability yet (tests/test_synthetic_length.py checks where it ends)."""
    logits = hf_logits[-40:] / 0.8
    top = logits.topk(50, dim=-1)
    probs = top.values.softmax(-1)
    kept = (probs.cumsum(-1) - probs) < 0.95
    end_id = cv.ORIGINAL_VOCAB_SIZE + SPEECH_TOKEN_SIZE
    speech = (top.indices >= cv.ORIGINAL_VOCAB_SIZE) & (top.indices < end_id)
    assert bool((speech | ~kept).all())
    assert float(logits.softmax(-1)[:, end_id].max()) < 1e-6


def test_same_seed_same_bytes(tmp_path, parts):
    assert _digests(_write_llm_parts(tmp_path / "again", seed=0)) == _digests(parts)
    other = qwen2lm_state_dict("tiny", seed=1)
    write_llm_pt(tmp_path / "other.pt", other)
    assert (tmp_path / "other.pt").read_bytes() != (parts / "llm.pt").read_bytes()


@pytest.mark.slow
def test_whole_checkpoint_through_the_script(tmp_path):
    from tritontts.cosyvoice2.frontend import CosyVoice2Frontend
    from tritontts.cosyvoice2.layout import missing_files
    from tritontts.cosyvoice2.spk2info import load_spk2info

    out = tmp_path / "cosyvoice2"
    command = [sys.executable, str(SCRIPT), "--model", "cosyvoice2", "--output-dir", str(out)]
    if PROMPT_WAV.is_file():
        command += ["--prompt-wav", str(PROMPT_WAV), "--prompt-text", REFERENCE]
    first = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "wrote a synthetic CosyVoice2" in first.stdout
    assert missing_files(out) == []
    model_dir = out / "CosyVoice2-0.5B"
    for name in (
        "llm.pt",
        "spk2info.pt",
        "CosyVoice-BlankEN/model.safetensors",
        "CosyVoice-BlankEN/vocab.json",
    ):
        assert (model_dir / name).is_file(), name
    assert json.loads((out / "SYNTHETIC.json").read_text())["preset"] == "tiny"
    speaker = load_spk2info(model_dir / "spk2info.pt")["001"]
    CosyVoice2Frontend.from_model_dir(model_dir)
    assert speaker.speech_token.shape[1] > 10 and speaker.embedding.shape == (1, 192)
    prompt = CosyVoice2Prompt.from_llm_dir(out / "cosyvoice2_llm")
    assert prompt.tokenizer.encode(speaker.prompt_text).ids == speaker.prompt_text_token[0].tolist()
    try:
        from tritontts.cosyvoice2.token2wav import Token2Wav
    except ImportError:
        pass
    else:
        Token2Wav.from_model_dir(model_dir)
    second = subprocess.run(command, capture_output=True, text=True, check=True)
    assert "already holds" in second.stdout
