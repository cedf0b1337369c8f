"""run.sh from a synthetic checkpoint to WAV files and a benchmark summary, offline then streaming (CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import soundfile

from tritontts.triton.server import free_ports

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_sh(*args: str, exp: Path, ports: list[int], timeout: int = 600) -> subprocess.CompletedProcess:
    command = [
        "bash",
        "run.sh",
        *args,
        "--exp_dir",
        str(exp),
        "--python",
        sys.executable,
        "--http_port",
        str(ports[0]),
        "--grpc_port",
        str(ports[1]),
        "--metrics_port",
        str(ports[2]),
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def exp(tmp_path_factory):
    return tmp_path_factory.mktemp("exp")


@pytest.mark.parametrize("mode, stages", [("offline", ("0", "5")), ("streaming", ("2", "5"))])
def test_stages_leave_wavs_and_a_summary(exp, bench_data, mode, stages):
    ports = free_ports(3)
    options = [
        "--model_source",
        "synthetic-tiny",
        "--llm_backend",
        "torch",
        "--max_new_tokens",
        "60",
        "--num_tasks",
        "2",
        "--dataset",
        str(bench_data),
        "--reference_audio",
        str(ROOT.parent / "shared/data/prompt_zh.wav"),
    ]
    try:
        done = run_sh(*stages, mode, *options, exp=exp, ports=ports)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:
        run_sh("stop", exp=exp, ports=ports)
    home = exp / "spark_tts"
    (run,) = json.loads((home / f"log_{mode}_tasks_2" / "summary.json").read_text())["runs"]
    assert (run["mode"], run["succeeded"], run["failed"]) == (mode, 4, 0)
    assert run["audio_seconds"] == pytest.approx(4 * 60 * 320 / 16000)
    wavs = list((home / f"log_{mode}_tasks_2").rglob("*.wav"))
    assert len(wavs) == 4
    single = list((home / f"single_{mode}").glob("*.wav"))
    assert len(single) == 1 and soundfile.info(single[0]).frames == 60 * 320
    assert (
        not (home / "tritonserver.pid").exists()
        or not Path(f"/proc/{(home / 'tritonserver.pid').read_text().strip()}").exists()
    )


def test_help_names_stage_6_and_its_options():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert "6  OpenAI-compatible API server in front of the running tritonserver" in done.stdout
    assert "stop ends the server that stage 3 started" in done.stdout
    for option in ("--api_host", "--api_port", "--api_key", "--api_model_name", "--voices_dir"):
        assert f"\n  {option} [" in done.stdout


def test_stage_6_serves_the_api_with_a_seeded_voice(tmp_path, prompt_zh):
    import os
    import signal
    import time

    import httpx

    api_port, dead_grpc_port = free_ports(2)
    command = ["bash", "run.sh", "6", "6", "--exp_dir", str(tmp_path), "--python", sys.executable]
    command += [
        "--api_port",
        str(api_port),
        "--grpc_port",
        str(dead_grpc_port),
        "--reference_audio",
        str(prompt_zh),
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stdout.read().decode()
            try:
                health = httpx.get(f"http://127.0.0.1:{api_port}/health", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "stage 6 did not start the API"
                time.sleep(0.3)
        assert health.status_code == 503  # no tritonserver on that port
        voices = httpx.get(f"http://127.0.0.1:{api_port}/v1/audio/voices", timeout=10).json()["data"]
        assert [v["id"] for v in voices] == ["default"]
        assert (tmp_path / "voices" / "default.txt").read_text().strip() == voices[0]["transcript"]
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)
