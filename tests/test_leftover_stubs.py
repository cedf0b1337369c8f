"""The test server fixture's last step: stubs of its repository that outlived it are killed, nothing else."""

import os
import subprocess
import sys
from pathlib import Path

from leftover_stubs import kill_leftover_stubs

from tritontts.triton.stubs import STUB_BINARY, stubs_serving


def fake_stub(bin_dir: Path, repo: Path, instance: str) -> subprocess.Popen:
    """A process with a stub's command line (python_backend r24.x) whose model.py only sleeps."""
    model_py = repo / "spark_tts" / "1" / "model.py"
    model_py.parent.mkdir(parents=True, exist_ok=True)
    model_py.write_text("import time\ntime.sleep(60)\n")
    stub = bin_dir / STUB_BINARY
    if not stub.exists():
        stub.symlink_to(os.path.realpath(sys.executable))
    args = [str(model_py), "triton_python_backend_shm_region_x", "67108864", "16777216", "1", "/b", "336"]
    return subprocess.Popen([str(stub), *args, instance, "DEFAULT"])


def test_only_the_stubs_of_the_servers_repository_are_killed(tmp_path):
    repo, other = tmp_path / "model_repo", tmp_path / "model_repo_other"
    ours = fake_stub(tmp_path, repo, "spark_tts_0_0")
    theirs = fake_stub(tmp_path, other, "spark_tts_0_1")
    try:
        assert [(s.pid, s.model, s.instance) for s in stubs_serving(repo)] == [
            (ours.pid, "spark_tts", "spark_tts_0_0")
        ]
        assert kill_leftover_stubs(repo) == [ours.pid]
        assert ours.wait(timeout=10) == -9
        assert theirs.poll() is None and stubs_serving(repo) == []
    finally:
        for process in (ours, theirs):
            process.kill()
            process.wait()
