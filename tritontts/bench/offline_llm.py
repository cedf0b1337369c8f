"""The in-process LLM backends of the one-process benchmark. `torch` is our engine (all prompts of a batch in
flight together), `hf` transformers' `Qwen2ForCausalLM.generate` (left-padded), `trtllm` TensorRT-LLM's
`ModelRunnerCpp`. Each returns, per prompt, the generated token ids without the end token. The `openai` chat
backend lives in `offline_openai`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tritontts.bench.offline_settings import BackendUnavailable, Decoding, OfflineSettings
from tritontts.llm.config import Qwen2Config

TRTLLM_MISSING = (
    "tensorrt_llm.runtime.ModelRunnerCpp cannot be imported; the trtllm backend needs NVIDIA's TensorRT-LLM "
    "container (use --backend torch or hf here)"
)

# Prompts in, and for each prompt either None (stop at the end id or after max_new_tokens) or the exact
# number of tokens to generate; out, the generated ids of each prompt.
Generate = Callable[[list[np.ndarray], list[int | None]], list[list[int]]]


class RequestSeeds:
    """The sampling seed of each request in order, `seed * 1_000_003 + n` for the run's n-th request (warm-ups
    included), so that backends which see the same batches sample each row with the same seed."""

    def __init__(self, seed: int) -> None:
        self.base = seed * 1_000_003
        self.issued = 0

    def take(self, count: int) -> list[int]:
        first = self.base + self.issued
        self.issued += count
        return list(range(first, first + count))


def resolve_dtype(name: str, device: torch.device, llm_dir: Path) -> torch.dtype:
    """`auto`: float32 on CPU, the LLM config's dtype elsewhere."""
    if name == "auto":
        name = (
            "float32" if device.type == "cpu" else Qwen2Config.from_file(llm_dir / "config.json").torch_dtype
        )
    return getattr(torch, name)


def torch_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    max_new_tokens: int,
) -> Generate:
    from tritontts.llm.engine import LLMEngine
    from tritontts.llm.sequence import SamplingParams

    engine = LLMEngine.from_pretrained(
        llm_dir,
        device=device,
        dtype=dtype,
        max_batch_size=max(settings.batch_sizes),
        max_seq_len=max_seq_len,
        cuda_graphs=device.type == "cuda",
        compile=settings.compile,
        output_tokens_from=decoding.output_tokens_from,
    )
    seeds = RequestSeeds(settings.seed)

    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        params = [
            SamplingParams(
                max_tokens=n or max_new_tokens,
                min_tokens=n or 0,
                seed=seed,
                end_id=decoding.end_id,
                pad_id=decoding.pad_id,
                **decoding.sampling(),
            )
            for n, seed in zip(forced, seeds.take(len(forced)), strict=True)
        ]
        for prompt, p in zip(prompts, params, strict=True):
            if len(prompt) + p.max_tokens > max_seq_len:
                raise ValueError(
                    f"a prompt of {len(prompt)} tokens + {p.max_tokens} new ones exceeds max_seq_len "
                    f"{max_seq_len}; pass a larger --max-seq-len"
                )
        return engine.generate([p.tolist() for p in prompts], params)

    return generate


def _left_padded(
    prompts: list[np.ndarray], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.from_numpy(np.asarray(p, dtype=np.int64))
        mask[i, width - len(p) :] = 1
    return ids.to(device), mask.to(device)


def _until_end(ids: list[int], end_id: int, limit: int | None) -> list[int]:
    ids = ids[: ids.index(end_id)] if end_id in ids else ids
    return ids[:limit] if limit is not None else ids


def hf_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_new_tokens: int,
) -> Generate:
    """Rows of a batch with fewer forced tokens than the batch's longest are generated as far as the longest
    (as `generate` does for every static batch) and cut to their own count."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(str(llm_dir), dtype=dtype).to(device).eval()
    if settings.compile:
        model.forward = torch.compile(model.forward)
    end_id, pad_id = decoding.end_id, decoding.pad_id

    @torch.inference_mode()
    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        ids, mask = _left_padded(prompts, pad_id, device)
        longest = max((n for n in forced if n is not None), default=None)
        lengths = {} if longest is None else {"min_new_tokens": longest}
        torch.manual_seed(settings.seed)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=longest or max_new_tokens,
            eos_token_id=end_id,
            pad_token_id=pad_id,
            **decoding.sampling(),
            **lengths,
        )
        new = out[:, ids.shape[1] :].tolist()
        return [_until_end(row, end_id, n) for row, n in zip(new, forced, strict=True)]

    return generate


def trtllm_available() -> bool:
    try:
        from tensorrt_llm.runtime import ModelRunnerCpp  # noqa: F401
    except ImportError:
        return False
    return True


def trtllm_backend(settings: OfflineSettings, decoding: Decoding, max_new_tokens: int) -> Generate:
    """Like `hf`, a batch runs as far as its longest forced count; rows are cut to their own."""
    if not trtllm_available():
        raise BackendUnavailable(TRTLLM_MISSING)
    if settings.engine_dir is None:
        raise ValueError("the trtllm backend needs --engine-dir (the output of trtllm-build)")
    from tensorrt_llm.runtime import ModelRunnerCpp

    runner = ModelRunnerCpp.from_dir(
        engine_dir=str(settings.engine_dir), max_batch_size=max(settings.batch_sizes)
    )
    end_id, pad_id = decoding.end_id, decoding.pad_id

    @torch.inference_mode()
    def generate(prompts: list[np.ndarray], forced: list[int | None]) -> list[list[int]]:
        longest = max((n for n in forced if n is not None), default=None)
        out = runner.generate(
            batch_input_ids=[torch.from_numpy(np.asarray(p, dtype=np.int32)) for p in prompts],
            max_new_tokens=longest or max_new_tokens,
            min_length=longest or 1,
            end_id=end_id,
            pad_id=pad_id,
            random_seed=settings.seed,
            return_dict=True,
            output_sequence_lengths=True,
            **decoding.sampling(),
        )
        ids, lengths = out["output_ids"], out["sequence_lengths"]
        rows = [ids[i, 0, len(p) : int(lengths[i, 0])].tolist() for i, p in enumerate(prompts)]
        return [_until_end(row, end_id, n) for row, n in zip(rows, forced, strict=True)]

    return generate


def llm_backend(
    settings: OfflineSettings,
    llm_dir: Path,
    decoding: Decoding,
    device: torch.device,
    dtype: torch.dtype,
    max_seq_len: int,
    max_new_tokens: int,
) -> Generate:
    if settings.backend == "torch":
        return torch_backend(settings, llm_dir, decoding, device, dtype, max_seq_len, max_new_tokens)
    if settings.backend == "hf":
        return hf_backend(settings, llm_dir, decoding, device, dtype, max_new_tokens)
    if settings.backend == "trtllm":
        return trtllm_backend(settings, decoding, max_new_tokens)
    raise ValueError(f"backend {settings.backend!r} does not take prompt ids")
