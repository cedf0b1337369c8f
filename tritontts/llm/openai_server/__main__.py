"""python -m tritontts.llm.openai_server --model-dir DIR [--host 127.0.0.1] [--port 8000] [--device cuda]"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import torch
import uvicorn

from tritontts.llm.engine import LLMEngine
from tritontts.llm.openai_server.app import ServedModel, create_app

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tritontts.llm.openai_server", description=__doc__)
    p.add_argument("--model-dir", required=True, help="Hugging Face Qwen2 directory with tokenizer.json")
    p.add_argument("--served-model-name", default=None, help="name in /v1/models (default: the directory's)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype", choices=tuple(DTYPES), default="auto", help="auto: fp32 on CPU, else the config's"
    )
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--max-seq-len", type=int, default=2560)
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--compile", action="store_true", help="torch.compile the decode step")
    p.add_argument(
        "--decode-attention",
        choices=("auto", "triton", "torch"),
        default="auto",
        help="decode steps' attention: the fused Triton kernel (auto: on CUDA) or the torch path",
    )
    p.add_argument(
        "--decode-linear",
        choices=("auto", "triton", "torch"),
        default="auto",
        help="decode steps' projections at batch 1-64: Triton kernels (auto: on CUDA) or cuBLAS",
    )
    p.add_argument(
        "--decode-pdl",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="batch-1 decode steps: their layers' Triton kernels launched with programmatic dependent launch "
        "(default: where the GPU is sm_90+ and the layers run the Triton kernels)",
    )
    p.add_argument(
        "--output-tokens-from",
        default="",
        help="the first vocabulary token the model may output, as text (<|s_0|>) or id; the head computes the "
        "rows from it on only (a speech LLM's outputs follow its text vocabulary). Default: every token",
    )
    p.add_argument("--log-level", default="info")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = get_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    engine = LLMEngine.from_pretrained(
        args.model_dir,
        device=args.device,
        dtype=DTYPES[args.dtype],
        max_batch_size=args.max_batch_size,
        max_seq_len=args.max_seq_len,
        cuda_graphs=args.cuda_graphs,
        compile=args.compile,
        decode_attention=args.decode_attention,
        decode_linear=args.decode_linear,
        output_tokens_from=args.output_tokens_from,
        decode_pdl=args.decode_pdl,
    )
    served = ServedModel.from_model_dir(engine, args.model_dir, args.served_model_name)
    uvicorn.run(create_app(served), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
