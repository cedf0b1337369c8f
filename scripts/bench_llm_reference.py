#!/usr/bin/env python3
"""A minimal reference decoder to hold bench_llm.py against, written apart from tritontts/llm (gpt-fast style).

Same weights as bench_llm.py (the full-size synthetic Spark-TTS LLM, seed 0). Static KV cache of
`--max-seq-len` positions that every step attends to in full (masked), one transformer block compiled by
inductor (weights as arguments, so one compile serves all layers) plus a compiled head that samples on the GPU
(top-k, top-p, temperature, exponential-race draw), the whole step captured by hand in one CUDA graph per batch
size. Each step the host reads the tokens back, as a server must. Prefill runs eagerly.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from tritontts.synthetic.qwen2 import qwen2_config, qwen2_state_dict


def rms(x, w, eps=1e-6):
    x32 = x.float()
    return w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope(x, cos, sin):  # x [B, L, heads, D]; cos/sin [B, L, 1, D]
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def block(w, x, cos, sin, pos, mask, kc, vc):
    """x [B, L, hidden] at positions pos [B, L]; writes the cache, attends to all of it under `mask`."""
    n1, wqkv, bqkv, wo, n2, wgu, wd = w
    b, length, _ = x.shape
    kv, d = kc.shape[1], kc.shape[3]
    heads = wo.shape[0] // d
    q, k, v = F.linear(rms(x, n1), wqkv, bqkv).split([heads * d, kv * d, kv * d], -1)
    q, k = rope(q.view(b, length, heads, d), cos, sin), rope(k.view(b, length, kv, d), cos, sin)
    rows = torch.arange(b, device=x.device).unsqueeze(1)
    kc[rows, :, pos] = k
    vc[rows, :, pos] = v.view(b, length, kv, d)
    q = q.view(b, length, kv, heads // kv, d).permute(0, 2, 3, 1, 4).reshape(b, kv, -1, d)
    scores = (q @ kc.transpose(-1, -2)) * d**-0.5
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1, dtype=torch.float32).to(x.dtype)
    o = (probs @ vc).view(b, kv, heads // kv, length, d).permute(0, 3, 1, 2, 4).reshape(b, length, -1)
    x = x + F.linear(o, wo)
    gate, up = F.linear(rms(x, n2), wgu).chunk(2, -1)
    return x + F.linear(F.silu(gate) * up, wd)


def head(x, norm, lm, temperature: float, top_k: int, top_p: float):
    logits = F.linear(rms(x[:, -1], norm), lm).float() / temperature
    top, ids = logits.topk(top_k, -1)
    probs = torch.softmax(top, -1)
    probs = probs.masked_fill(torch.cumsum(probs, -1) - probs >= top_p, 0)
    choice = (probs / torch.empty_like(probs).exponential_()).argmax(-1, keepdim=True)
    return ids.gather(1, choice).squeeze(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch-sizes", default="1,4,16,64,128")
    ap.add_argument("--prompt-len", type=int, default=300)
    ap.add_argument("--gen-len", type=int, default=500)
    ap.add_argument("--max-seq-len", type=int, default=2560)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="full", help="tiny: a smoke test (CPU: no CUDA graph)")
    ap.add_argument("--output", default="bench_llm_reference.json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    dt, vocab = (torch.bfloat16, 166_000) if dev.type == "cuda" else (torch.float32, 1000)
    cfg = qwen2_config(args.preset, vocab, dt)
    sd = qwen2_state_dict(args.preset, seed=0, vocab_size=vocab, dtype=dt)
    g = lambda name: sd[name].to(dev)  # noqa: E731
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        qkv = [f"{p}self_attn.{n}_proj" for n in "qkv"]
        layers.append((
            g(p + "input_layernorm.weight"), torch.cat([g(n + ".weight") for n in qkv]),
            torch.cat([g(n + ".bias") for n in qkv]), g(p + "self_attn.o_proj.weight"),
            g(p + "post_attention_layernorm.weight"),
            torch.cat([g(p + "mlp.gate_proj.weight"), g(p + "mlp.up_proj.weight")]), g(p + "mlp.down_proj.weight"),
        ))  # fmt: skip
    embed, norm = g("model.embed_tokens.weight"), g("model.norm.weight")
    d, kv, s = cfg["hidden_size"] // cfg["num_attention_heads"], cfg["num_key_value_heads"], args.max_seq_len
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, d, 2, device=dev).float() / d)
    ang = torch.outer(torch.arange(s, device=dev).float(), inv).repeat(1, 2)
    cos_t, sin_t = ang.cos().to(dt), ang.sin().to(dt)
    sample = dict(temperature=0.8, top_k=50, top_p=0.95)
    cblock, chead = (torch.compile(f, fullgraph=True, dynamic=False) for f in (block, head))

    def forward(ids, pos, caches, blk, hd):
        cos, sin = cos_t[pos].unsqueeze(2), sin_t[pos].unsqueeze(2)
        groups = cfg["num_attention_heads"] // kv
        mask = (torch.arange(s, device=dev) <= pos.unsqueeze(-1)).unsqueeze(1).repeat(1, 1, groups, 1)
        x = embed[ids]
        for w, (kc, vc) in zip(layers, caches):
            x = blk(w, x, cos, sin, pos, mask, kc, vc)
        return hd(x, norm, embed, **sample)

    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    report = {"command": shlex.join(["python", *sys.argv]), "device": name,
              "torch": torch.__version__, "settings": vars(args) | sample}  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for bs in map(int, args.batch_sizes.split(",")):
            caches = [[torch.zeros(bs, kv, s, d, device=dev, dtype=dt) for _ in "kv"] for _ in layers]
            prompt = torch.randint(0, vocab, (bs, args.prompt_len), generator=gen).to(dev)
            tok, pos = (
                torch.zeros(bs, dtype=torch.long, device=dev),
                torch.zeros(bs, 1, dtype=torch.long, device=dev),
            )

            def step(tok=tok, pos=pos, caches=caches):
                tok.copy_(forward(tok.unsqueeze(1), pos, caches, cblock, chead))
                pos.add_(1)

            t0 = time.perf_counter()
            for _ in range(3):
                step()  # compile + warm-up
            graph = torch.cuda.CUDAGraph() if dev.type == "cuda" else None
            if graph is not None:
                torch.cuda.synchronize()
                with torch.cuda.graph(graph):
                    step()
            replay = graph.replay if graph is not None else step
            build_s = time.perf_counter() - t0
            firsts, times = [], []
            for _ in range(5 if bs == 1 else 1):
                tok.tolist()
                t0 = time.perf_counter()
                full = torch.arange(args.prompt_len, device=dev).expand(bs, -1)
                tok.copy_(forward(prompt, full, caches, block, head))
                pos.fill_(args.prompt_len)
                replay()
                tok.tolist()
                firsts.append(1e3 * (time.perf_counter() - t0))
            for _ in range(args.gen_len - 1):
                t0 = time.perf_counter()
                replay()
                tok.tolist()
                times.append(1e3 * (time.perf_counter() - t0))
            ms = statistics.median(times)
            report[f"batch_{bs}"] = {"decode_ms_per_step_median": ms, "decode_tokens_per_s": bs * 1e3 / ms,
                                     "prefill_plus_first_step_ms": statistics.median(firsts), "build_s": build_s}  # fmt: skip
            print(
                f"reference batch {bs}: {ms:.3f} ms/step, first token {statistics.median(firsts):.1f} ms",
                flush=True,
            )
            del graph, replay, caches
    open(args.output, "w").write(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
