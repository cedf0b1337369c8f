"""The listen-address defaults of every server the toolkit starts, read from their own argument parsers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_script_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def defaults() -> dict[str, str]:
    from tritontts.llm.openai_server.__main__ import get_parser as llm_parser
    from tritontts.openai_api.__main__ import get_parser as api_parser
    from tritontts.triton.disaggregated.cli import get_parser as disagg_parser
    from tritontts.triton.server import ServerConfig

    triton_cli = _script("triton_server")
    disagg = ["start", "--state-file", "s.json", "--model-repo", "r", "--llm-model-dir", "l"]
    return {
        "speech API --host": api_parser().parse_args([]).host,
        "LLM OpenAI server --host": llm_parser().parse_args(["--model-dir", "x"]).host,
        "scripts/triton_server.py --address": triton_cli.parse_args(["start", "--model-repo", "x"]).address,
        "disaggregated start --address": disagg_parser().parse_args(disagg).address,
        "TritonServer address": ServerConfig(model_repo=Path("x")).address,
    }
