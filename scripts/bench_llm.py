#!/usr/bin/env python3
"""Benchmark our LLM engine against transformers `generate` on the same weights; writes one JSON file.

Default: the full-size synthetic Spark-TTS LLM (random weights), bf16 on CUDA, prompt 300, 500 generated
tokens per request, top_k 50 / top_p 0.95 / T 0.8, end_id ignored so every step runs.
Smoke check on CPU: `python scripts/bench_llm.py --device cpu --tiny`.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from tritontts.bench.kernel_profile import kernels_per_call
from tritontts.llm.config import Qwen2Config
from tritontts.llm.decode_kernels import DECODE_ATTENTION
from tritontts.llm.engine import LLMEngine
from tritontts.llm.loader import build_model, load_pretrained, output_token_id
from tritontts.llm.model import attention_block, decode_lengths, decoder_layer
from tritontts.llm.runner import ModelRunner
from tritontts.llm.sequence import SamplingParams
from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict
from tritontts.triton.params import parse_auto_bool

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TARGETS = {  # issue 17 (H100)
    "decode_ms_bs1_max": 0.9,
    "decode_ms_bs16_max": 1.2,
    "decode_ms_bs64_max": 1.6,
    "prefill_plus_first_step_ms_max": 8.0,
    "speedup_vs_hf_bs1_min": 65.0,
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", help="HF Qwen2 checkpoint dir; default: random full-size weights")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default bf16 on CUDA, fp32 on CPU")
    parser.add_argument("--tiny", action="store_true", help="tiny random model and short sequences")
    parser.add_argument("--prompt-len", type=int, help="default 300 (32 with --tiny)")
    parser.add_argument("--gen-len", type=int, help="default 500 (48 with --tiny)")
    parser.add_argument("--batch-sizes", default="1,4,16,64,128")
    parser.add_argument("--hf-batch-sizes", default="1,16", help="empty to skip transformers")
    parser.add_argument("--hf-gen-len", type=int, help="tokens per transformers run; default --gen-len")
    parser.add_argument("--max-seq-len", type=int, default=2560)
    parser.add_argument("--no-cuda-graphs", action="store_true")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decode step and the padded prefill (inductor)",
    )
    parser.add_argument(
        "--no-compile-prefill", action="store_true", help="with --compile, leave the padded prefill eager"
    )
    parser.add_argument(
        "--decode-attention",
        choices=DECODE_ATTENTION,
        default="auto",
        help="decode steps' attention: the fused Triton kernel, the torch path, or auto (Triton on CUDA)",
    )
    parser.add_argument(
        "--decode-linear",
        choices=DECODE_ATTENTION,
        default="auto",
        help="decode steps' projections at batch 1-64: the Triton kernels, cuBLAS (torch), or auto (Triton on CUDA)",
    )
    parser.add_argument(
        "--decode-pdl",
        choices=("auto", "true", "false"),
        default="auto",
        help="batch-1 decode steps' layers uncompiled, their Triton kernels launched with programmatic dependent "
        "launch: auto (sm_90+ with the Triton kernels), true, false",
    )
    parser.add_argument(
        "--top-k-kernel",
        choices=DECODE_ATTENTION,
        default="auto",
        help="decode steps' top-k at up to 64 candidates: the Triton kernels, torch.topk, or auto (Triton on CUDA)",
    )
    parser.add_argument(
        "--attention-combine",
        choices=("fold", "kernel"),
        default="fold",
        help="how the Triton decode attention combines its splits: in its last split (default) or a second kernel",
    )
    parser.add_argument(
        "--max-top-k", type=int, default=0, help="the engine's max_top_k (default: top-k, at least 64)"
    )
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=50)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument(
        "--output-tokens-from",
        default="0",
        help="the engine's output window: the first id it may output (a token of --model-dir's tokenizer, or an "
        "id; 0: the whole vocabulary). run.sh serves Spark-TTS from <|endoftext|> (151643)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="kernels of a replayed decode step and prefill graph (CUDA)"
    )
    parser.add_argument(
        "--reference", action="store_true", help="then run scripts/bench_llm_reference.py (same sizes)"
    )
    parser.add_argument("--output", default="bench_llm.json")
    args = parser.parse_args()
    args.prompt_len = args.prompt_len or (32 if args.tiny else 300)
    args.gen_len = args.gen_len or (48 if args.tiny else 500)
    args.hf_gen_len = args.hf_gen_len or args.gen_len
    args.dtype = args.dtype or ("fp32" if args.device == "cpu" else "bf16")
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def import_transformers():
    """transformers, told that scipy and scikit-learn are absent when scipy does not import: Qwen2 needs
    neither, and a PyTorch image's scipy (built for numpy 2) fails under the numpy<2 the servers need."""
    try:
        import scipy.sparse  # noqa: F401
    except Exception:
        for name in [m for m in sys.modules if m.split(".")[0] in ("scipy", "sklearn")]:
            del sys.modules[name]
        sys.modules["scipy"] = sys.modules["sklearn"] = None
    import transformers

    return transformers


def build_models(args, device: torch.device, dtype: torch.dtype):
    """Our model and a transformers model holding the same weights (None when HF is not benchmarked)."""
    want_hf = bool(args.hf_batch_sizes.strip())
    if args.model_dir:
        ours = load_pretrained(args.model_dir, device, dtype)
        hf = None
        if want_hf:
            transformers = import_transformers()
            hf = transformers.Qwen2ForCausalLM.from_pretrained(args.model_dir, dtype=dtype).to(device).eval()
        return ours, hf
    preset = "tiny" if args.tiny else "full"
    vocab = 1000 if args.tiny else 166_000
    raw = qwen2_config(preset, vocab_size=vocab, dtype=dtype)
    if args.tiny:
        raw |= {"bos_token_id": None, "eos_token_id": None}
    state = qwen2_state_dict(preset, seed=0, vocab_size=vocab, dtype=dtype)
    ours = build_model(Qwen2Config.from_dict(raw), state, device, dtype, source="synthetic")
    hf = None
    if want_hf:
        transformers = import_transformers()
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**raw)).to(dtype)
        missing, unexpected = hf.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        hf.tie_weights()
        hf = hf.to(device).eval()
    return ours, hf


def prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).tolist()


@torch.inference_mode()
def decode_attention_check(runner: ModelRunner, compiled: bool) -> dict:
    """The Triton decode attention against the torch path (same dtype, and fp32) on random inputs of the
    engine's shapes, through `attention_block` on copies of random caches; under torch.compile too."""
    shape, device, dtype = runner.shape, runner.device, runner.dtype
    gen = torch.Generator(device=device).manual_seed(0)
    paths = {name: replace(shape, decode_attention=name) for name in ("torch", "triton")}
    compiled_block = torch.compile(attention_block, fullgraph=True, dynamic=False) if compiled else None
    results = {}
    for batch in sorted({1, runner.max_batch_size}):
        positions = torch.randint(0, runner.max_seq_len, (batch, 1), generator=gen, device=device)
        positions[0] = runner.max_seq_len - 1  # the longest row and, in a batch, the shortest
        if batch > 1:
            positions[-1] = 0
        tokens = torch.zeros_like(positions)
        ctx = runner.model.context(tokens, positions, slice(0, batch), runner.max_seq_len)
        ctx = replace(ctx, lengths=decode_lengths(positions, runner.max_seq_len))
        width = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
        qkv = torch.randn(batch, 1, width, generator=gen, device=device, dtype=dtype)
        k, v = (torch.randn(runner.cache.k[0].shape, generator=gen, device=device, dtype=dtype) for _ in "kv")
        out = {name: attention_block(p, qkv, k.clone(), v.clone(), ctx).float() for name, p in paths.items()}
        exact = attention_block(paths["torch"], qkv.float(), k.float(), v.float(), ctx)
        entry = {
            "max_abs_diff_triton_vs_torch": (out["triton"] - out["torch"]).abs().max().item(),
            "max_abs_err_triton_vs_fp32": (out["triton"] - exact).abs().max().item(),
            "max_abs_err_torch_vs_fp32": (out["torch"] - exact).abs().max().item(),
        }
        if compiled_block is not None:
            again = compiled_block(paths["triton"], qkv, k.clone(), v.clone(), ctx).float()
            entry["max_abs_diff_compiled_vs_eager_triton"] = (again - out["triton"]).abs().max().item()
        entry["ok"] = entry["max_abs_err_triton_vs_fp32"] <= max(2 * entry["max_abs_err_torch_vs_fp32"], 1e-4)
        results[f"batch_{batch}"] = entry
        print(f"decode attention check batch {batch}: {entry}", flush=True)
    return results


def decode_pdl_check(runner: ModelRunner) -> dict:
    """The batch-1 layers with programmatic dependent launch against without, from the same random residual
    stream and caches at the engine's shapes: launched one after another, and replayed from a CUDA graph."""
    device, dtype, config = runner.device, runner.dtype, runner.model.config
    gen = torch.Generator(device=device).manual_seed(0)
    position = runner.max_seq_len // 2
    positions = torch.full((1, 1), position, device=device)
    ctx = runner.model.context(torch.zeros_like(positions), positions, slice(0, 1), runner.max_seq_len)
    counters = torch.zeros(config.num_key_value_heads, dtype=torch.int32, device=device)
    ctx = replace(ctx, lengths=decode_lengths(positions, runner.max_seq_len), counters=counters)
    x0 = torch.randn(1, 1, config.hidden_size, generator=gen, device=device, dtype=dtype)
    caches = [torch.randn(k.shape, generator=gen, device=device, dtype=dtype) for k in runner.cache.k[:2]]

    def layers(shape):
        x, delta, written = x0, None, []
        for weights in runner.weights:
            k, v = caches[0].clone(), caches[1].clone()
            x, delta = decoder_layer(shape, weights, x, delta, k, v, ctx)
            written.append(k[0, :, position])
        return torch.cat(
            [x.float().flatten(), delta.float().flatten(), torch.stack(written).float().flatten()]
        )

    plain = layers(replace(runner.pdl_shape, pdl=False))
    launched = layers(runner.pdl_shape)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = layers(runner.pdl_shape)
    graph.replay()
    torch.cuda.synchronize(device)
    result = {
        "max_abs_diff_launched": (launched - plain).abs().max().item(),
        "max_abs_diff_graph": (captured - plain).abs().max().item(),
    }
    result["ok"] = result["max_abs_diff_launched"] == 0 and result["max_abs_diff_graph"] == 0
    print(f"decode PDL check: {result}", flush=True)
    return result


def bench_ours(engine: LLMEngine, args, device: torch.device, vocab: int) -> dict:
    params = SamplingParams(
        max_tokens=args.gen_len, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=0
    )
    prompt = prompts(1, args.prompt_len, vocab)[0]
    prefill_ms = []
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        int(engine.runner.prefill(0, prompt, params, seed=0))
        prefill_ms.append(1e3 * (time.perf_counter() - start))
    engine.runner.free_slot(0)
    results = {
        "prefill_ms": statistics.median(prefill_ms[1:]),
        "first_token": first_token(engine, args, device, vocab),
    }
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        for request in prompts(batch, args.prompt_len, vocab, seed=batch):
            engine.add_request(request, params)
        sync(device)
        start = time.perf_counter()
        engine.step()  # all prefills, then the first decode step is queued
        first_step = time.perf_counter() - start
        step_ms = []
        while engine.has_work():
            t0 = time.perf_counter()
            engine.step()
            step_ms.append(1e3 * (time.perf_counter() - t0))
        total = time.perf_counter() - start
        decode_ms = statistics.median(step_ms[:-1] or step_ms)
        results[f"batch_{batch}"] = {
            "decode_ms_per_step_median": decode_ms,
            "decode_ms_per_step_mean": statistics.fmean(step_ms),
            "decode_tokens_per_s": batch * 1e3 / decode_ms,
            "prefills_plus_queued_first_step_ms": 1e3 * first_step,
            "end_to_end_s": total,
            "end_to_end_tokens_per_s": batch * args.gen_len / total,
        }
        print(f"ours batch {batch}: {decode_ms:.3f} ms/step, {batch * 1e3 / decode_ms:.0f} tok/s", flush=True)
    return results


def first_token(engine: LLMEngine, args, device: torch.device, vocab: int) -> dict:
    """One request alone, from its first `engine.step()` until its second token (prefill, then the first decode
    step) is handed out (median of 8), with the
    prefill through its length bucket's CUDA graph, the same padded forward eagerly, and unpadded eagerly."""
    runner = engine.runner
    params = SamplingParams(max_tokens=2, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    prompt = prompts(1, args.prompt_len, vocab, seed=7)[0]
    graphs, lengths = runner.prefill_graphs, runner.prefill_lengths
    variants = {"graph": (graphs, lengths), "padded_eager": ({}, lengths), "unpadded_eager": ({}, [])}
    results = {}
    for name, (graphs_used, lengths_used) in variants.items():
        runner.prefill_graphs, runner.prefill_lengths = graphs_used, lengths_used
        times = []
        for _ in range(10):
            done = []
            engine.add_request(
                prompt, params, lambda e, done=done: e.finished and done.append(time.perf_counter())
            )
            sync(device)
            start = time.perf_counter()
            while engine.has_work():
                engine.step()
            times.append(1e3 * (done[0] - start))
        results[f"prefill_plus_first_step_ms_{name}"] = statistics.median(times[2:])
        print(
            f"ours prefill {len(prompt)} + first step ({name}): {results[f'prefill_plus_first_step_ms_{name}']:.2f} ms"
        )
    runner.prefill_graphs, runner.prefill_lengths = graphs, lengths
    results["prefill_buckets"] = lengths
    return results


def profile_decode(engine: LLMEngine, args, steps: int = 20) -> dict:
    """Kernel count and GPU time per replayed decode step (torch.profiler sees the kernels in the graph)."""
    runner, results = engine.runner, {}
    keys = runner.kv_bucket(args.prompt_len + args.gen_len)
    count = runner.candidates([SamplingParams(temperature=args.temperature, top_k=args.top_k)])
    for batch in [b for b in (1, 16, 64) if (b, keys, count) in runner.graphs]:
        graph = runner.graphs[batch, keys, count]
        graph.replay()
        profile = kernels_per_call(graph.replay, runner.device, calls=steps, top=30)
        results[f"batch_{batch}_kv_{keys}"] = profile
        print(
            f"profile batch {batch}: {profile['per_call']:.0f} kernels, {profile['ms_per_call']:.3f} ms of"
            " kernels per step",
            flush=True,
        )
    widths = [n for n in runner.prefill_lengths if n >= args.prompt_len]
    if widths and widths[0] in runner.prefill_graphs:
        width = widths[0]
        profile = kernels_per_call(runner.prefill_graphs[width].replay, runner.device, calls=steps, top=30)
        results[f"prefill_{width}"] = profile
        print(
            f"profile prefill {width}: {profile['per_call']:.0f} kernels, {profile['ms_per_call']:.3f} ms of kernels",
            flush=True,
        )
    return results


@torch.inference_mode()
def bench_hf(hf, args, device: torch.device, vocab: int) -> dict:
    def run(batch: int, new_tokens: int) -> float:
        ids = torch.tensor(prompts(batch, args.prompt_len, vocab, seed=batch), device=device)
        sync(device)
        start = time.perf_counter()
        hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=None,
            pad_token_id=0,
        )
        sync(device)
        return time.perf_counter() - start

    results = {}
    run(1, 4)
    for batch in [int(b) for b in args.hf_batch_sizes.split(",")]:
        first = run(batch, 1)
        total = run(batch, args.hf_gen_len)
        step_ms = 1e3 * (total - first) / max(args.hf_gen_len - 1, 1)
        results[f"batch_{batch}"] = {
            "prefill_ms": 1e3 * first,
            "decode_ms_per_step": step_ms,
            "decode_tokens_per_s": batch * 1e3 / step_ms,
            "end_to_end_s": total,
            "end_to_end_tokens_per_s": batch * args.hf_gen_len / total,
        }
        print(f"transformers batch {batch}: {step_ms:.3f} ms/step", flush=True)
    return results


def target_checks(ours: dict, hf: dict) -> dict:
    checks = {}
    for batch in (1, 16, 64):
        if f"batch_{batch}" in ours:
            ms = ours[f"batch_{batch}"]["decode_ms_per_step_median"]
            checks[f"decode_ms_bs{batch}"] = ms
            checks[f"decode_ms_bs{batch}_ok"] = ms <= TARGETS[f"decode_ms_bs{batch}_max"]
    first = ours["first_token"]["prefill_plus_first_step_ms_graph"]
    checks["prefill_plus_first_step_ms"] = first
    checks["prefill_plus_first_step_ms_ok"] = first <= TARGETS["prefill_plus_first_step_ms_max"]
    for key, entry in hf.items():
        if key in ours:
            speedup = ours[key]["end_to_end_tokens_per_s"] / entry["end_to_end_tokens_per_s"]
            checks[f"speedup_{key}"] = speedup
            checks[f"decode_step_speedup_{key}"] = (
                entry["decode_ms_per_step"] / ours[key]["decode_ms_per_step_median"]
            )
    if "batch_1" in hf and "batch_1" in ours:
        checks["speedup_batch_1_ok"] = checks["speedup_batch_1"] >= TARGETS["speedup_vs_hf_bs1_min"]
    return checks


def run_reference(args) -> dict:
    """The reference script in its own process (its own compile caches and GPU memory), same sizes."""
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "reference.json"
        command = [
            sys.executable,
            str(Path(__file__).with_name("bench_llm_reference.py")),
            *("--device", args.device, "--preset", "tiny" if args.tiny else "full"),
            *("--batch-sizes", args.batch_sizes, "--prompt-len", str(args.prompt_len)),
            *(
                "--gen-len",
                str(args.gen_len),
                "--max-seq-len",
                str(args.max_seq_len),
                "--output",
                str(output),
            ),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            return {"error": done.stderr[-2000:]}
        return json.loads(output.read_text())


def reference_checks(ours: dict, reference: dict) -> dict:
    checks = {}
    for key, entry in reference.items():
        if key.startswith("batch_") and key in ours:
            ratio = ours[key]["decode_ms_per_step_median"] / entry["decode_ms_per_step_median"]
            checks[f"decode_{key}_over_reference"] = ratio
            checks[f"decode_{key}_below_reference"] = ratio < 1
    return checks


def main() -> None:
    args = parse_args()
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    torch.manual_seed(0)
    clock = time.perf_counter()
    seconds: dict[str, float] = {}

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[phase] = round(now - clock, 1)
        clock = now

    ours_model, hf = build_models(args, device, dtype)
    lap("load_models")
    vocab = ours_model.config.vocab_size
    start = time.perf_counter()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    if args.attention_combine == "kernel":
        import torch._functorch.config as functorch_config

        import tritontts.llm.decode_attention as kernels

        kernels.FOLD_COMBINE = False
        # inductor's caches do not key on it: a graph compiled with the fold would come back from them
        torch._inductor.config.fx_graph_cache = False
        functorch_config.enable_autograd_cache = False
    engine = LLMEngine.from_model(
        ours_model,
        max_batch_size=max(batch_sizes),
        graph_batch_sizes=batch_sizes,
        max_seq_len=args.max_seq_len,
        cuda_graphs=not args.no_cuda_graphs,
        compile=args.compile,
        compile_prefill=not args.no_compile_prefill,
        max_top_k=args.max_top_k or max(args.top_k, 64),
        decode_attention=args.decode_attention,
        decode_linear=args.decode_linear,
        top_k_kernel=args.top_k_kernel,
        output_tokens_from=output_token_id(args.model_dir or ".", args.output_tokens_from),
        decode_pdl=parse_auto_bool(args.decode_pdl),
    )
    build_s = time.perf_counter() - start
    lap("engine_build")
    check = {}
    if engine.runner.decode_attention == "triton" and device.type == "cuda":
        check = decode_attention_check(engine.runner, args.compile)
    lap("decode_attention_check")
    if engine.runner.pdl_shape is not None:
        check["decode_pdl"] = decode_pdl_check(engine.runner)
    ours = bench_ours(engine, args, device, vocab)
    if args.profile and device.type == "cuda" and engine.runner.graphs:
        try:
            ours["profile"] = profile_decode(engine, args)
        except Exception as error:  # the benchmark itself is kept
            ours["profile"] = {"error": f"{type(error).__name__}: {error}"}
    runner_info = {
        "decode_graphs": len(engine.runner.graphs),
        "kv_buckets": engine.runner.kv_lengths,
        "decode_attention_used": engine.runner.decode_attention,
        "decode_linear_used": engine.runner.decode_linear,
        "decode_pdl": engine.runner.pdl_shape is not None,
        "top_k_kernel_used": engine.runner.top_k_kernel,
        "candidate_counts": engine.runner.candidate_counts,
    }
    del engine
    lap("ours")
    hf_results = bench_hf(hf, args, device, vocab) if hf is not None else {}
    lap("transformers")
    del hf
    if device.type == "cuda":
        torch.cuda.empty_cache()
    reference = run_reference(args) if args.reference else {}
    lap("reference")
    transformers = import_transformers()

    report = {
        "command": shlex.join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "dtype": args.dtype,
        "settings": {k: v for k, v in vars(args).items() if k not in ("output", "dtype", "device")}
        | {
            "device": args.device,
            "engine_build_s": build_s,
            "graphs_captured": device.type == "cuda" and not args.no_cuda_graphs,
        }
        | runner_info,
        "decode_attention_check": check,
        "phase_seconds": seconds,
        "ours": ours,
        "transformers_generate": hf_results,
        "targets": TARGETS,
        "reference": reference,
        "checks": target_checks(ours, hf_results) | reference_checks(ours, reference),
    }
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["checks"], indent=2))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
