"""Our Qwen2 engine against transformers.Qwen2ForCausalLM on tiny random checkpoints (CPU, fp32)."""

import json

import pytest
import torch
from tolerance import max_error, within

from tritontts.checkpoint import CheckpointError, read_state_dict, write_safetensors
from tritontts.llm.engine import LLMEngine
from tritontts.llm.kv_cache import KVCache
from tritontts.llm.loader import load_pretrained
from tritontts.llm.sequence import SamplingParams

transformers = pytest.importorskip("transformers")
from hf_reference import tiny_hf_qwen2  # noqa: E402

VOCAB = 1000
PROMPT = [5, 17, 912, 33, 4, 250, 251, 7, 99, 640, 3]


def tiny_hf_model(tie: bool, seed: int = 0):
    return tiny_hf_qwen2(VOCAB, tied=tie, seed=seed)


@pytest.fixture(scope="module", params=["untied", "tied", "sharded"])
def hf_checkpoint(request, tmp_path_factory):
    model = tiny_hf_model(tie=request.param != "untied")
    out = tmp_path_factory.mktemp(request.param)
    shard = "100KB" if request.param == "sharded" else "5GB"
    model.save_pretrained(out, max_shard_size=shard)
    if request.param == "sharded":
        assert (out / "model.safetensors.index.json").exists()
    return model, out


def our_greedy_logits(
    model, prompt: list[int], steps: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[int]]:
    model.init_rope(64)
    cache = KVCache(model.config, 2, 64, torch.device("cpu"), torch.float32)
    k, v, slot = cache.k, cache.v, slice(1, 2)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        prefill = model(
            ids, torch.arange(len(prompt)).unsqueeze(0), k, v, slot, kv_len=len(prompt), last_only=False
        )[0]
        tokens, step_logits = [int(prefill[-1].argmax())], []
        for i in range(steps):
            position = torch.tensor([[len(prompt) + i]])
            logits = model(torch.tensor([[tokens[-1]]]), position, k, v, slot, kv_len=64)[0]
            step_logits.append(logits)
            tokens.append(int(logits.argmax()))
    return prefill, step_logits, tokens


@pytest.mark.golden
def test_prefill_and_decode_logits_match_transformers(hf_checkpoint):
    hf, path = hf_checkpoint
    ours = load_pretrained(path, "cpu")
    prefill, step_logits, tokens = our_greedy_logits(ours, PROMPT, 20)
    with torch.no_grad():
        reference = hf(torch.tensor([PROMPT + tokens[:-1]])).logits[0]
    n = len(PROMPT)
    within("prefill logits", max_error(prefill, reference[:n]), 1e-4)
    for i, logits in enumerate(step_logits):
        within(f"step {i} logits", max_error(logits, reference[n + i]), 1e-4)
    assert len(set(tokens)) > 3, "degenerate checkpoint: greedy repeats one token"


def test_greedy_generation_equals_transformers_generate(hf_checkpoint):
    hf, path = hf_checkpoint
    engine = LLMEngine.from_pretrained(path, "cpu", max_batch_size=4, max_seq_len=128)
    prompts = [PROMPT, PROMPT[:4], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    ours = engine.generate(prompts, SamplingParams(max_tokens=25, temperature=0))
    for prompt, tokens in zip(prompts, ours):
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt]), max_new_tokens=25, min_new_tokens=25, do_sample=False)
        assert tokens == out[0, len(prompt) :].tolist()


def test_bf16_file_loads_into_fp32_on_cpu(tmp_path):
    hf = tiny_hf_model(tie=True)
    hf.to(torch.bfloat16).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()).get("dtype", "bfloat16") == "bfloat16"
    ours = load_pretrained(tmp_path, "cpu")
    assert ours.model.embed_tokens.weight.dtype == torch.float32
    expected = read_state_dict(tmp_path / "model.safetensors")["model.embed_tokens.weight"].float()
    assert torch.equal(ours.model.embed_tokens.weight, expected)


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda s: s.pop("model.layers.1.self_attn.k_proj.bias"), "model.layers.1.self_attn.k_proj.bias"),
        (lambda s: s.pop("model.norm.weight"), "model.norm.weight"),
        (lambda s: s.__setitem__("model.extra.weight", torch.zeros(3)), "model.extra.weight"),
        (lambda s: s.__setitem__("model.norm.weight", torch.zeros(3)), "model.norm.weight"),
    ],
)
def test_strict_loading_names_the_bad_key(tmp_path, edit, key):
    hf = tiny_hf_model(tie=True)
    hf.save_pretrained(tmp_path)
    state = read_state_dict(tmp_path / "model.safetensors")
    edit(state)
    write_safetensors(state, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_pretrained(tmp_path, "cpu")
