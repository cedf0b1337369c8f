"""HF Qwen2 -> TensorRT-LLM checkpoint: names, layout and tensor-parallel shards, proven by a forward pass.

The reference forward below is written against TensorRT-LLM's weight names and layout (fused q|k|v, `mlp.fc`
under the activation, `mlp.gate` the linear branch, rope_gpt_neox, RMSNorm, vocab-parallel lm_head) and must
reproduce `transformers.Qwen2ForCausalLM` logits from the converted tensors, for one rank and for several.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from tolerance import within

from tritontts.checkpoint import CheckpointError, write_safetensors
from tritontts.synthetic.qwen2 import qwen2_config, write_qwen2
from tritontts.trtllm import build
from tritontts.trtllm.convert import ConvertOptions, HfQwen2Config, convert_checkpoint, trtllm_config

transformers = pytest.importorskip("transformers")
from hf_reference import tiny_hf_qwen2  # noqa: E402

VOCAB = 501  # odd: tp=2 and tp=4 must pad the lm_head rows
REPO = Path(__file__).resolve().parents[1]


def tiny_qwen2(tied: bool, seed: int = 0):
    return tiny_hf_qwen2(VOCAB, tied=tied, seed=seed)


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def hf_model_dir(request, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    model = tiny_qwen2(tied=request.param)
    out = tmp_path_factory.mktemp("hf_tied" if request.param else "hf_untied")
    model.save_pretrained(out, safe_serialization=True)
    return out, model


def convert(model_dir: Path, out: Path, **options) -> tuple[dict, list[dict[str, torch.Tensor]]]:
    opts = ConvertOptions(**{"dtype": "float32", **options})
    convert_checkpoint(model_dir, out, opts)
    config = json.loads((out / "config.json").read_text())
    return config, [load_file(out / f"rank{r}.safetensors") for r in range(opts.tp_size)]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_gpt_neox(x: torch.Tensor, base: float) -> torch.Tensor:
    """x: [heads, seq, head_size]; rotate the two halves of every head (GPT-NeoX style)."""
    head_size, seq = x.shape[-1], x.shape[-2]
    inv_freq = 1.0 / base ** (torch.arange(0, head_size, 2, dtype=torch.float64) / head_size)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    cos, sin = torch.cat([angles, angles], -1).cos().float(), torch.cat([angles, angles], -1).sin().float()
    half = head_size // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rank_attention(x: torch.Tensor, w: dict, layer: str, cfg: dict) -> torch.Tensor:
    tp, d = cfg["mapping"]["tp_size"], cfg["head_size"]
    heads = cfg["num_attention_heads"] // tp
    kv_heads = max(1, cfg["num_key_value_heads"] // tp)
    qkv = x @ w[layer + "attention.qkv.weight"].T + w[layer + "attention.qkv.bias"]
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = (t.reshape(-1, n, d).transpose(0, 1) for t, n in ((q, heads), (k, kv_heads), (v, kv_heads)))
    q, k = rope_gpt_neox(q, cfg["rotary_base"]), rope_gpt_neox(k, cfg["rotary_base"])
    k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
    context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return context.transpose(0, 1).reshape(x.shape[0], heads * d) @ w[layer + "attention.dense.weight"].T


def rank_mlp(x: torch.Tensor, w: dict, layer: str) -> torch.Tensor:
    activated = F.silu(x @ w[layer + "mlp.fc.weight"].T) * (x @ w[layer + "mlp.gate.weight"].T)
    return activated @ w[layer + "mlp.proj.weight"].T


def embed(ids: torch.Tensor, ranks: list[dict], cfg: dict) -> torch.Tensor:
    tables = [w["transformer.vocab_embedding.weight"] for w in ranks]
    if not cfg["use_parallel_embedding"] or len(ranks) == 1:
        return F.embedding(ids, tables[0])
    return F.embedding(ids, torch.cat(tables, dim=cfg["embedding_sharding_dim"]))


def reference_logits(ids: torch.Tensor, ranks: list[dict], cfg: dict) -> torch.Tensor:
    """Row-parallel outputs are summed over ranks (the all-reduce); lm_head shards are concatenated."""
    eps = cfg["norm_epsilon"]
    h = embed(ids, ranks, cfg)
    for i in range(cfg["num_hidden_layers"]):
        layer = f"transformer.layers.{i}."
        x = rms_norm(h, ranks[0][layer + "input_layernorm.weight"], eps)
        h = h + sum(rank_attention(x, w, layer, cfg) for w in ranks)
        x = rms_norm(h, ranks[0][layer + "post_layernorm.weight"], eps)
        h = h + sum(rank_mlp(x, w, layer) for w in ranks)
    h = rms_norm(h, ranks[0]["transformer.ln_f.weight"], eps)
    logits = torch.cat([h @ w["lm_head.weight"].T for w in ranks], dim=-1)
    return logits[:, : cfg["vocab_size"]]


def hf_logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids[None]).logits[0]


IDS = torch.tensor([3, 17, 250, 499, 42, 7, 7, 128, 0, 500])


def _within_assert_close(ours: torch.Tensor, expected: torch.Tensor) -> None:
    """torch.testing.assert_close(atol=1e-4, rtol=1e-4), recorded: |difference| / (atol + rtol |expected|) < 1."""
    ratio = (ours - expected).abs() / (1e-4 + 1e-4 * expected.abs())
    within("logits, |diff| / (1e-4 + 1e-4 |ref|)", float(ratio.max()), 1.0)


@pytest.mark.golden
@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_reference_forward_on_converted_weights_matches_transformers(hf_model_dir, tmp_path, tp_size):
    model_dir, model = hf_model_dir
    cfg, ranks = convert(model_dir, tmp_path, tp_size=tp_size)
    with torch.no_grad():
        ours = reference_logits(IDS, ranks, cfg)
    _within_assert_close(ours, hf_logits(model, IDS))


@pytest.mark.golden
@pytest.mark.parametrize("sharding_dim", [0, 1])
def test_parallel_embedding_shards_match_transformers(hf_model_dir, tmp_path, sharding_dim):
    model_dir, model = hf_model_dir
    cfg, ranks = convert(
        model_dir, tmp_path, tp_size=2, use_parallel_embedding=True, embedding_sharding_dim=sharding_dim
    )
    rows = 251 if sharding_dim == 0 else VOCAB
    assert ranks[1]["transformer.vocab_embedding.weight"].shape == (rows, 64 // (2 if sharding_dim else 1))
    with torch.no_grad():
        ours = reference_logits(IDS, ranks, cfg)
    _within_assert_close(ours, hf_logits(model, IDS))


def test_weight_names_and_shapes(hf_model_dir, tmp_path):
    model_dir, model = hf_model_dir
    _, (w,) = convert(model_dir, tmp_path)
    expected = {"transformer.vocab_embedding.weight", "transformer.ln_f.weight", "lm_head.weight"}
    for i in range(2):
        p = f"transformer.layers.{i}."
        expected |= {p + n for n in ("attention.qkv.weight", "attention.qkv.bias", "attention.dense.weight")}
        expected |= {p + f"mlp.{n}.weight" for n in ("fc", "gate", "proj")}
        expected |= {p + "input_layernorm.weight", p + "post_layernorm.weight"}
    assert set(w) == expected
    hf = dict(model.named_parameters())
    assert w["transformer.layers.0.attention.qkv.weight"].shape == (64 + 2 * 2 * 16, 64)
    torch.testing.assert_close(
        w["transformer.layers.1.mlp.fc.weight"], hf["model.layers.1.mlp.gate_proj.weight"]
    )
    torch.testing.assert_close(
        w["transformer.layers.1.mlp.gate.weight"], hf["model.layers.1.mlp.up_proj.weight"]
    )
    torch.testing.assert_close(w["lm_head.weight"], model.lm_head.weight)


def unfuse_qkv(t: torch.Tensor, cfg: dict, tp: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = cfg["head_size"]
    q_rows, kv_rows = cfg["num_attention_heads"] // tp * d, max(1, cfg["num_key_value_heads"] // tp) * d
    return t.split([q_rows, kv_rows, kv_rows], dim=0)


def test_tp2_shards_concatenate_to_tp1(hf_model_dir, tmp_path):
    model_dir, _ = hf_model_dir
    cfg, (full,) = convert(model_dir, tmp_path / "tp1")
    _, ranks = convert(model_dir, tmp_path / "tp2", tp_size=2)
    for name, tensor in full.items():
        parts = [r[name] for r in ranks]
        if name.endswith(("attention.qkv.weight", "attention.qkv.bias")):
            pieces = [unfuse_qkv(p, cfg, 2) for p in parts]
            joined = torch.cat([torch.cat([p[j] for p in pieces]) for j in range(3)])
        elif name.endswith(("mlp.fc.weight", "mlp.gate.weight")):
            joined = torch.cat(parts, dim=0)
        elif name.endswith(("attention.dense.weight", "mlp.proj.weight")):
            joined = torch.cat(parts, dim=1)
        elif name == "lm_head.weight":
            joined = torch.cat(parts, dim=0)
            assert joined.shape[0] == 502 and not joined[VOCAB:].any()
            joined = joined[:VOCAB]
        else:
            assert all(torch.equal(p, tensor) for p in parts), name
            continue
        torch.testing.assert_close(joined, tensor, rtol=0, atol=0, msg=name)


def test_kv_heads_are_replicated_when_fewer_than_ranks(hf_model_dir, tmp_path):
    model_dir, model = hf_model_dir
    cfg, ranks = convert(model_dir, tmp_path, tp_size=4)
    k_full = dict(model.named_parameters())["model.layers.0.self_attn.k_proj.weight"]
    for rank, w in enumerate(ranks):
        _, k, _ = unfuse_qkv(w["transformer.layers.0.attention.qkv.weight"], cfg, 4)
        kv_head = rank // 2  # 2 kv heads over 4 ranks: ranks 0,1 hold head 0; ranks 2,3 head 1
        torch.testing.assert_close(k, k_full[kv_head * 16 : (kv_head + 1) * 16])


def test_config_fields_follow_the_hf_config(hf_model_dir, tmp_path):
    model_dir, model = hf_model_dir
    cfg, _ = convert(model_dir, tmp_path, dtype="bfloat16", tp_size=2)
    hf = model.config
    assert cfg["architecture"] == "Qwen2ForCausalLM"
    assert cfg["dtype"] == "bfloat16" and cfg["logits_dtype"] == "float32"
    for ours, theirs in [
        ("vocab_size", "vocab_size"),
        ("hidden_size", "hidden_size"),
        ("intermediate_size", "intermediate_size"),
        ("num_hidden_layers", "num_hidden_layers"),
        ("num_attention_heads", "num_attention_heads"),
        ("num_key_value_heads", "num_key_value_heads"),
        ("max_position_embeddings", "max_position_embeddings"),
        ("norm_epsilon", "rms_norm_eps"),
        ("tie_word_embeddings", "tie_word_embeddings"),
        ("hidden_act", "hidden_act"),
    ]:
        assert cfg[ours] == getattr(hf, theirs), ours
    assert cfg["head_size"] == 16 and cfg["rotary_base"] == 1_000_000.0 and cfg["rotary_scaling"] is None
    assert cfg["position_embedding_type"] == "rope_gpt_neox" and cfg["qwen_type"] == "qwen2"
    assert cfg["attn_bias"] is True and cfg["mlp_bias"] is False
    assert (
        cfg["mapping"]["world_size"] == 2
        and cfg["mapping"]["tp_size"] == 2
        and cfg["mapping"]["pp_size"] == 1
    )
    assert cfg["quantization"]["quant_algo"] is None and cfg["quantization"]["kv_cache_quant_algo"] is None
    assert cfg["use_parallel_embedding"] is False and cfg["embedding_sharding_dim"] == 0
    w = load_file(tmp_path / "rank1.safetensors")
    assert {t.dtype for t in w.values()} == {torch.bfloat16}


def test_full_spark_llm_config_matches_a_real_conversion():
    hf = HfQwen2Config.from_dict(qwen2_config("full", dtype=torch.bfloat16))
    cfg = trtllm_config(hf, ConvertOptions(dtype="bfloat16"))
    facts = {
        "vocab_size": 166000,
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "intermediate_size": 4864,
        "head_size": 64,
        "rotary_base": 1000000.0,
        "norm_epsilon": 1e-6,
        "attn_bias": True,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "position_embedding_type": "rope_gpt_neox",
        "qwen_type": "qwen2",
        "max_position_embeddings": 32768,
        "dtype": "bfloat16",
    }
    assert {k: cfg[k] for k in facts} == facts


def test_auto_dtype_turns_float32_into_float16(hf_model_dir, tmp_path):
    model_dir, _ = hf_model_dir
    cfg, (w,) = convert(model_dir, tmp_path, dtype="auto")
    assert cfg["dtype"] == "float16" and w["lm_head.weight"].dtype == torch.float16


def test_sharded_hf_checkpoint_and_cli(tmp_path):
    hf_dir = tmp_path / "hf"
    written = write_qwen2(hf_dir, "tiny", seed=1, vocab_size=VOCAB, max_shard_size="100KB")
    assert (hf_dir / "model.safetensors.index.json") in written
    spec = importlib.util.spec_from_file_location("convert_cli", REPO / "scripts" / "convert_checkpoint.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    out = tmp_path / "trt"
    argv = [
        "--model_dir",
        str(hf_dir),
        "--output_dir",
        str(out),
        "--dtype",
        "float16",
        "--tp_size",
        "2",
        "--pp_size",
        "1",
    ]
    assert cli.main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "rank0.safetensors", "rank1.safetensors"]
    assert cli.main(["--model_dir", str(tmp_path / "nowhere"), "--output_dir", str(out)]) == 1


def test_missing_and_unexpected_keys_are_named(hf_model_dir, tmp_path):
    model_dir, _ = hf_model_dir
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    state = load_file(broken / "model.safetensors")
    state.pop("model.layers.1.mlp.up_proj.weight")
    state["model.layers.1.mlp.extra.weight"] = torch.zeros(2)
    write_safetensors(state, broken / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*model\.layers\.1\.mlp\.extra"
    ):
        convert_checkpoint(broken, tmp_path / "out", ConvertOptions())


def test_indivisible_heads_are_refused(hf_model_dir, tmp_path):
    model_dir, _ = hf_model_dir
    with pytest.raises(ValueError, match="num_attention_heads"):
        convert_checkpoint(model_dir, tmp_path, ConvertOptions(tp_size=3))
    with pytest.raises(ValueError, match="pp_size"):
        convert_checkpoint(model_dir, tmp_path, ConvertOptions(pp_size=2))


# trtllm-build


def test_build_command_renders_the_set_knobs_only():
    args = build.TrtllmBuildArgs("ckpt", "engines", gemm_plugin="bfloat16", max_seq_len=2560)
    assert build.build_command(args) == [
        "trtllm-build",
        "--checkpoint_dir",
        "ckpt",
        "--output_dir",
        "engines",
        "--max_batch_size",
        "16",
        "--max_num_tokens",
        "32768",
        "--gemm_plugin",
        "bfloat16",
        "--max_seq_len",
        "2560",
    ]


def test_build_cli_takes_run_sh_flags(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(build, "run_build", lambda args: seen.setdefault("args", args) and tmp_path)
    monkeypatch.setattr(build, "tensorrt_llm_available", lambda: False)
    argv = ["--checkpoint_dir", "c", "--output_dir", "e", "--max_batch_size", "8", "--max_num_tokens", "4096"]
    argv += ["--gemm_plugin", "bfloat16", "--smoke_test_tokenizer_dir", str(tmp_path)]
    assert build.main(argv) == 0
    assert seen["args"] == build.TrtllmBuildArgs(
        "c", "e", max_batch_size=8, max_num_tokens=4096, gemm_plugin="bfloat16"
    )


def test_run_build_without_trtllm_build_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="trtllm-build is not on PATH"):
        build.run_build(build.TrtllmBuildArgs(str(tmp_path), str(tmp_path / "e")))


def test_run_build_runs_the_rendered_command(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    calls = []
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/trtllm-build")
    monkeypatch.setattr(build.subprocess, "run", lambda argv, check: calls.append((argv, check)))
    build.run_build(build.TrtllmBuildArgs(str(tmp_path), "e"))
    assert calls == [
        (build.build_command(build.TrtllmBuildArgs(str(tmp_path), "e"), "/usr/bin/trtllm-build"), True)
    ]


@pytest.mark.skipif(build.tensorrt_llm_available(), reason="tensorrt_llm is importable here")
def test_smoke_test_without_tensorrt_llm_raises_a_clear_error(tmp_path):
    with pytest.raises(build.TrtllmUnavailable, match="tensorrt_llm is not importable"):
        build.smoke_test(tmp_path, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(
    not build.tensorrt_llm_available() or shutil.which("trtllm-build") is None,
    reason="needs TensorRT-LLM and a GPU (NVIDIA's trtllm container)",
)
def test_engine_build_and_smoke_test_on_a_tiny_spark_llm(tmp_path):
    from tritontts.synthetic.spark import write_spark_llm

    llm_dir = write_spark_llm(tmp_path / "LLM", "tiny", seed=0)
    convert_checkpoint(llm_dir, tmp_path / "ckpt", ConvertOptions(dtype="float16"))
    args = build.TrtllmBuildArgs(
        str(tmp_path / "ckpt"),
        str(tmp_path / "engine"),
        max_batch_size=2,
        max_num_tokens=1024,
        gemm_plugin="float16",
    )
    engine_dir = build.run_build(args)
    assert build.smoke_test(engine_dir, llm_dir, max_new_tokens=8)


# the tensorrt_llm model template

TEMPLATE = REPO / "model_repo" / "tensorrt_llm" / "config.pbtxt"
RUN_SH_FILL = {  # the values run.sh stage 2 (and the upstream runtimes) fill in
    "triton_backend": "tensorrtllm",
    "triton_max_batch_size": "16",
    "decoupled_mode": "True",
    "max_beam_width": "1",
    "engine_dir": "/workspace/exp/spark_tts/trt_engines_bfloat16",
    "max_tokens_in_paged_kv_cache": "2560",
    "max_attention_window_size": "2560",
    "kv_cache_free_gpu_mem_fraction": "0.5",
    "exclude_input_in_output": "True",
    "enable_kv_cache_reuse": "False",
    "batching_strategy": "inflight_fused_batching",
    "max_queue_delay_microseconds": "0",
    "encoder_input_features_data_type": "TYPE_FP16",
    "logits_datatype": "TYPE_FP32",
}


def fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("${" + key + "}", value)
    return text


def test_template_placeholders_are_exactly_the_ones_run_sh_fills():
    assert set(re.findall(r"\$\{(\w+)\}", TEMPLATE.read_text())) == set(RUN_SH_FILL)


@pytest.mark.parametrize("decoupled", ["True", "False"])
def test_filled_template_parses_as_a_triton_model_config(decoupled):
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    filled = fill(TEMPLATE.read_text(), {**RUN_SH_FILL, "decoupled_mode": decoupled})
    assert "${" not in filled
    config = text_format.Parse(filled, model_config_pb2.ModelConfig())
    assert (config.name, config.backend, config.max_batch_size) == ("tensorrt_llm", "tensorrtllm", 16)
    assert config.model_transaction_policy.decoupled is (decoupled == "True")
    inputs = {t.name: t for t in config.input}
    assert {"input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "streaming"} <= set(
        inputs
    )
    assert not inputs["input_lengths"].optional and inputs["input_ids"].allow_ragged_batch
    assert {"output_ids", "sequence_length"} <= {t.name for t in config.output}
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["gpt_model_path"] == RUN_SH_FILL["engine_dir"]
    assert params["gpt_model_type"] == "inflight_fused_batching"
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert (TEMPLATE.parent / "1").is_dir()


def test_build_cli_reports_a_missing_trtllm_build(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert build.main(["--checkpoint_dir", str(tmp_path), "--output_dir", str(tmp_path / "e")]) == 1
    assert "trtllm-build is not on PATH" in capsys.readouterr().err
