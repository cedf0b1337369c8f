"""The modules of tritontts.bench import one another one way only: read from their source with `ast`, every import
counted (those inside functions and under TYPE_CHECKING too)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

PACKAGE = "tritontts.bench"
BENCH = Path(__file__).resolve().parents[1] / "tritontts" / "bench"
SHARED_TYPES = ("offline_settings", "offline_results")
RUNNER = "offline"


def bench_imports(path: Path, modules: set[str]) -> set[str]:
    """The tritontts.bench modules that the file at `path` imports, by their short names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            package, _, short = name.rpartition(".")
            if package == PACKAGE and short in modules:
                found.add(short)
    return found - {path.stem}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = {p.stem: p for p in BENCH.glob("*.py") if p.stem != "__init__"}
    return {name: bench_imports(path, set(files)) for name, path in files.items()}


def test_the_graph_sees_the_runner_and_its_pipelines(graph):
    assert {"offline_spark", "offline_cosyvoice2", "offline_cosyvoice2_dit"} <= graph[RUNNER]
    assert "offline_cosyvoice2_prompt" in graph["offline_openai"]


def test_bench_modules_import_each_other_without_a_cycle(graph):
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:
        pytest.fail(f"import cycle among {PACKAGE} modules: {' -> '.join(error.args[1])}")
    assert set(order) == set(graph)


def test_shared_types_import_no_other_offline_module(graph):
    for name in SHARED_TYPES:
        assert not {m for m in graph[name] if m.startswith(RUNNER)}, name


def test_no_offline_module_imports_the_runner(graph):
    importers = sorted(name for name, imports in graph.items() if RUNNER in imports)
    assert not [name for name in importers if name.startswith(f"{RUNNER}_")]
