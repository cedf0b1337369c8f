"""`trtllm-build` for a converted checkpoint, and a smoke test of the engine it writes.

    python -m tritontts.trtllm.build --checkpoint_dir CKPT --output_dir ENGINE --max_batch_size 16 \
        --max_num_tokens 32768 --gemm_plugin bfloat16 [--smoke_test_tokenizer_dir HF_LLM_DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass, fields
from pathlib import Path

SMOKE_PROMPT = "<|task_tts|><|start_content|>hello world<|end_content|><|start_global_token|>"
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


@dataclass(frozen=True)
class TrtllmBuildArgs:
    """Knobs of `trtllm-build`; a field left at None is not passed, so trtllm-build's default applies."""

    checkpoint_dir: str
    output_dir: str
    max_batch_size: int = 16
    max_num_tokens: int = 32768
    gemm_plugin: str | None = "auto"  # auto | bfloat16 | float16 | float32 | disable
    max_input_len: int | None = None
    max_seq_len: int | None = None
    max_beam_width: int | None = None
    gpt_attention_plugin: str | None = None
    remove_input_padding: str | None = None  # enable | disable
    context_fmha: str | None = None  # enable | disable
    use_paged_context_fmha: str | None = None  # enable | disable
    kv_cache_type: str | None = None  # paged | continuous | disabled
    multiple_profiles: str | None = None  # enable | disable
    workers: int | None = None
    log_level: str | None = None


def build_command(args: TrtllmBuildArgs, executable: str = "trtllm-build") -> list[str]:
    """The argv of `trtllm-build` for `args`: `--name value` for every field that is set."""
    argv = [executable]
    for field in fields(args):
        value = getattr(args, field.name)
        if value is not None:
            argv += [f"--{field.name}", str(value)]
    return argv


def run_build(args: TrtllmBuildArgs) -> Path:
    """Run `trtllm-build`; the engine directory on success, CalledProcessError on failure."""
    executable = shutil.which("trtllm-build")
    if executable is None:
        raise RuntimeError(
            "trtllm-build is not on PATH: build engines inside NVIDIA's tritonserver:<ver>-trtllm-python-py3 image"
        )
    if not (Path(args.checkpoint_dir) / "config.json").exists():
        raise FileNotFoundError(f"no TensorRT-LLM checkpoint (config.json) in {args.checkpoint_dir}")
    command = build_command(args, executable)
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    return Path(args.output_dir)


def tensorrt_llm_available() -> bool:
    try:
        import tensorrt_llm  # noqa: F401
    except ImportError:
        return False
    return True


class TrtllmUnavailable(RuntimeError):
    """`tensorrt_llm` cannot be imported here."""


def end_token_id(tokenizer) -> int:
    for token in END_TOKENS:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token_id
    raise ValueError(f"the tokenizer has none of the end tokens {END_TOKENS}")


def smoke_test(engine_dir: str | Path, tokenizer_dir: str | Path, max_new_tokens: int = 16) -> list[int]:
    """Greedy-decode a few tokens from a Spark-TTS prompt with the engine; the new token ids.

    Raises TrtllmUnavailable where `tensorrt_llm` cannot be imported.
    """
    if not tensorrt_llm_available():
        raise TrtllmUnavailable(
            "tensorrt_llm is not importable: the engine smoke test needs NVIDIA's container"
        )
    import torch
    from tensorrt_llm.runtime import ModelRunner

    try:
        from tensorrt_llm.runtime import ModelRunnerCpp as Runner
    except ImportError:
        Runner = ModelRunner
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    prompt = tokenizer.encode(SMOKE_PROMPT, add_special_tokens=False).ids
    end_id = end_token_id(tokenizer)
    runner = Runner.from_dir(engine_dir=str(engine_dir))
    with torch.no_grad():
        output_ids = runner.generate(
            batch_input_ids=[torch.tensor(prompt, dtype=torch.int32)],
            max_new_tokens=max_new_tokens,
            end_id=end_id,
            pad_id=end_id,
            top_k=1,
        )
    torch.cuda.synchronize()
    new_tokens = output_ids[0, 0, len(prompt) :].tolist()
    new_tokens = new_tokens[: new_tokens.index(end_id)] if end_id in new_tokens else new_tokens
    if not new_tokens:
        raise RuntimeError(f"the engine in {engine_dir} generated no token for the smoke prompt")
    return new_tokens


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for field in fields(TrtllmBuildArgs):
        required = field.name in ("checkpoint_dir", "output_dir")
        kind = int if field.type in ("int", "int | None") else str
        default = None if required else field.default
        parser.add_argument(f"--{field.name}", type=kind, default=default, required=required)
    parser.add_argument(
        "--smoke_test_tokenizer_dir",
        help="after the build, decode a few tokens with the engine, tokenizing with this HF LLM directory",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    args = TrtllmBuildArgs(**{f.name: getattr(ns, f.name) for f in fields(TrtllmBuildArgs)})
    try:
        engine_dir = run_build(args)
    except (RuntimeError, FileNotFoundError, subprocess.CalledProcessError) as err:
        print(f"trtllm build failed: {err}", file=sys.stderr)
        return 1
    print(f"engine written to {engine_dir}")
    if ns.smoke_test_tokenizer_dir:
        try:
            tokens = smoke_test(engine_dir, ns.smoke_test_tokenizer_dir)
        except TrtllmUnavailable as err:
            print(f"smoke test skipped: {err}")
            return 0
        print(f"smoke test: the engine generated {len(tokens)} tokens: {tokens}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
