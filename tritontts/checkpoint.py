"""Reading weight files and loading them strictly into modules."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file as load_safetensors
from safetensors.torch import save_file as save_safetensors


class CheckpointError(ValueError):
    """A checkpoint does not match the module it is loaded into."""


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a `.safetensors`, a sharded `*.safetensors.index.json` or a torch `.bin`/`.pt` file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weight file not found: {path}")
    if path.name.endswith(".index.json"):
        index = json.loads(path.read_text())
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(index["weight_map"].values())):
            state.update(read_state_dict(path.parent / shard))
        return state
    if path.suffix == ".safetensors":
        return load_safetensors(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path} does not hold a state_dict (found {type(state).__name__})")
    return dict(state)


def find_weights(directory: str | Path, candidates: Iterable[str]) -> Path:
    """The first of `candidates` that exists in `directory`."""
    directory = Path(directory)
    names = list(candidates)
    for name in names:
        if (directory / name).exists():
            return directory / name
    raise CheckpointError(f"no weight file in {directory}: looked for {', '.join(names)}")


def write_safetensors(
    state: Mapping[str, torch.Tensor], path: str | Path, metadata: dict | None = None
) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    save_safetensors(tensors, str(path), metadata=metadata or {"format": "pt"})


def load_strict(
    module: torch.nn.Module,
    state: Mapping[str, torch.Tensor],
    source: str = "checkpoint",
    ignore_prefixes: tuple[str, ...] = (),
) -> None:
    """Copy `state` into `module`; every missing, unexpected or mis-shaped key is an error naming it.

    Keys that start with one of `ignore_prefixes` (training-only heads shipped in a file) are skipped.
    """
    expected = module.state_dict()
    given = {k: v for k, v in state.items() if not k.startswith(ignore_prefixes)}
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    misshaped = sorted(
        f"{k}: {tuple(given[k].shape)} in {source}, {tuple(expected[k].shape)} expected"
        for k in set(given) & set(expected)
        if tuple(given[k].shape) != tuple(expected[k].shape)
    )
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped keys: {'; '.join(misshaped)}")
    if problems:
        raise CheckpointError(f"{source} does not match {type(module).__name__}: " + " | ".join(problems))
    module.load_state_dict(dict(given), strict=True)


def build_and_load(
    build: Callable[[], torch.nn.Module],
    weights: str | Path,
    device: str | torch.device = "cpu",
    init_buffers: Callable[[torch.nn.Module], None] | None = None,
) -> torch.nn.Module:
    """`build()` on the meta device, made real on `device` (`init_buffers` fills what the file does not hold),
    then `weights` (a plain state_dict of tensors) loaded strictly."""
    state = read_state_dict(weights)
    if any(not isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{weights} holds values that are not tensors")
    with torch.device("meta"):
        module = build()
    module.to_empty(device=device)
    if init_buffers is not None:
        init_buffers(module)
    load_strict(module, state, source=str(weights))
    return module
