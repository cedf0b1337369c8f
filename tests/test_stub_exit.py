"""A stopping tritonserver ends cleanly: every model's stub exits at `finalize` (no interpreter teardown), and the
server's `--exit-timeout-secs` covers the unload of its largest model (python_backend unloads a model's instances
one after another, each after a 1 s health check), so a BLS of many instances does not end in "failed to stop
server: Exit timeout expired"."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from waiting import wait_until

from tritontts.triton.server import ServerConfig, TritonServer, free_ports, stop_grace_s
from tritontts.triton.stubs import STUB_BINARY, end_stub_process, in_stub, list_stubs
from tritontts.triton.unload import (
    REQUEST_GRACE_S,
    UNLOAD_S_PER_INSTANCE,
    exit_timeout_for,
    exit_timeout_of,
    instances_in,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL_FILES = sorted(p for p in REPO_ROOT.glob("model_repo*/*/1/model.py") if not p.is_symlink())


def test_instances_in_counts_every_group_and_each_listed_gpu():
    assert instances_in("instance_group [\n  { count: 16, kind: KIND_CPU }\n]") == 16
    assert instances_in("instance_group [ { count: 2, kind: KIND_GPU, gpus: [ 0, 1 ] }, { count: 3 } ]") == 7
    assert instances_in('name: "no_groups"') == 1


def test_exit_timeout_covers_the_model_with_most_instances(tmp_path):
    for name, count in (("bls", 16), ("llm", 1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.pbtxt").write_text(
            f"instance_group [ {{ count: {count}, kind: KIND_CPU }} ]\n"
        )
    assert exit_timeout_for(tmp_path) == REQUEST_GRACE_S + UNLOAD_S_PER_INSTANCE * 16
    assert exit_timeout_for(tmp_path / "missing") == REQUEST_GRACE_S + UNLOAD_S_PER_INSTANCE


def test_the_server_command_carries_one_exit_timeout(tmp_path):
    (tmp_path / "bls").mkdir()
    (tmp_path / "bls" / "config.pbtxt").write_text("instance_group [ { count: 64, kind: KIND_CPU } ]\n")
    sized = TritonServer(ServerConfig(model_repo=tmp_path)).command()
    assert exit_timeout_of(sized) == exit_timeout_for(tmp_path) == 158
    assert stop_grace_s(exit_timeout_of(sized)) == 168
    chosen = TritonServer(ServerConfig(model_repo=tmp_path, exit_timeout_s=5)).command()
    assert exit_timeout_of(chosen) == 5 and stop_grace_s(5) == 40
    extra = TritonServer(ServerConfig(model_repo=tmp_path, extra_args=("--exit-timeout-secs=90",))).command()
    assert [a for a in extra if a.startswith("--exit-timeout-secs")] == ["--exit-timeout-secs=90"]


def test_end_stub_process_does_nothing_outside_a_stub():
    assert not in_stub()
    end_stub_process()


def test_end_stub_process_ends_a_stub_at_once_without_teardown(tmp_path):
    """The interpreter copied under the stub's binary name: the call exits 0 before the rest of the script and
    before atexit handlers, with what was printed flushed."""
    fake_stub = tmp_path / STUB_BINARY
    shutil.copy2(os.path.realpath(sys.executable), fake_stub)
    script = (
        "import atexit, sys\n"
        "from tritontts.triton.stubs import end_stub_process, in_stub\n"
        "atexit.register(lambda: print('teardown ran'))\n"
        "print('in stub', in_stub()); sys.stdout.write('unflushed')\n"
        "end_stub_process()\n"
        "print('after the call')\n"
    )
    paths = [str(REPO_ROOT), sysconfig.get_paths()["purelib"], *sys.path]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONHOME=sys.base_prefix)
    done = subprocess.run(
        [str(fake_stub), "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "in stub True\nunflushed"


@pytest.mark.parametrize("model_py", MODEL_FILES, ids=lambda p: str(p.relative_to(REPO_ROOT).parent.parent))
def test_every_model_ends_its_stub_last_in_finalize(model_py):
    tree = ast.parse(model_py.read_text())
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel")
    finalize = next((f for f in model.body if isinstance(f, ast.FunctionDef) and f.name == "finalize"), None)
    assert finalize is not None, f"{model_py}: TritonPythonModel has no finalize"
    last = finalize.body[-1]
    assert isinstance(last, ast.Expr) and ast.unparse(last.value) == "end_stub_process()", ast.unparse(last)


def many_instance_repo(root: Path, count: int) -> Path:
    """Our text_inbox model (its finalize ends the stub) with `count` instances."""
    repo = root / "repo"
    target = repo / "text_inbox"
    shutil.copytree(REPO_ROOT / "model_repo_cosyvoice2" / "text_inbox", target)
    config = target / "config.pbtxt"
    config.write_text(re.sub(r"count: \d+", f"count: {count}", config.read_text()))
    return repo


@pytest.mark.triton
def test_a_server_with_a_many_instance_model_stops_cleanly(tmp_path):
    http_port, grpc_port, metrics_port = free_ports(3)
    log = tmp_path / "server.log"
    config = ServerConfig(
        model_repo=many_instance_repo(tmp_path, 8), http_port=http_port, grpc_port=grpc_port,
        metrics_port=metrics_port, log_file=log, pid_file=tmp_path / "server.pid",
    )  # fmt: skip
    server = TritonServer(config)
    server.start()
    try:
        server.wait_ready(timeout=300)
        stubs = list_stubs(server.pid)
        assert len(stubs) == 8, stubs
    finally:
        code = server.stop()
    wait_until(
        lambda: [s for s in stubs if Path(f"/proc/{s.pid}").exists()],
        lambda left: not left,
        what="every stub of the stopped server gone",
        timeout=30,
    )
    text = log.read_text(errors="replace")
    assert code == 0, server.log_tail()
    assert "successfully unloaded 'text_inbox'" in text
    assert "failed to stop server" not in text and "Fatal Python error" not in text
