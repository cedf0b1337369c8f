"""The test server fixture's last step: stubs of its repository that outlived it are killed, nothing else."""

import subprocess
import sys
import time

from leftover_stubs import kill_leftover_stubs, stubs_serving


def fake_stub(model_py: str) -> subprocess.Popen:
    script = "import time; time.sleep(60)"
    return subprocess.Popen(
        [
            "bash",
            "-c",
            f'exec -a /x/triton_python_backend_stub {sys.executable} -c "{script}" {model_py} shm 1',
        ],
    )


def test_only_the_stubs_of_the_servers_repository_are_killed(tmp_path):
    repo, other = tmp_path / "model_repo", tmp_path / "model_repo_other"
    ours = fake_stub(f"{repo}/spark_tts/1/model.py")
    theirs = fake_stub(f"{other}/spark_tts/1/model.py")
    try:
        deadline = time.monotonic() + 10
        while ours.pid not in stubs_serving(repo) and time.monotonic() < deadline:
            time.sleep(0.05)  # until bash has exec'd
        assert stubs_serving(repo) == [ours.pid]
        assert kill_leftover_stubs(repo) == [ours.pid]
        assert ours.wait(timeout=10) == -9
        assert theirs.poll() is None and stubs_serving(repo) == []
    finally:
        for process in (ours, theirs):
            process.kill()
            process.wait()
