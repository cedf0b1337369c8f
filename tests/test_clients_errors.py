"""The clients' answers when they cannot be served: one clear line on stderr, a non-zero exit, no traceback."""

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tritontts.bench.triton_io import ServerCheckError, check_server

REPO = Path(__file__).resolve().parents[1]


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_client(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_one_clear_line(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for text in expected:
        assert text in lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["client_grpc.py", "--mode", "offline"],
        ["client_grpc.py", "--mode", "streaming"],
        ["client_http.py"],
    ],
    ids=["grpc-offline", "grpc-streaming", "http"],
)
def test_dead_server_is_one_line(args):
    port = unused_port()
    command = [sys.executable, *args, "--server-addr", "127.0.0.1", "--server-port", str(port)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert_one_clear_line(result, "cannot reach Triton", f"127.0.0.1:{port}")


def test_grpc_main_in_process_against_dead_server(capsys):
    client = load_client("client_grpc")
    assert client.main(["--server-addr", "127.0.0.1", "--server-port", str(unused_port())]) == 2
    assert capsys.readouterr().err.startswith("error: cannot reach Triton")


class FakeClient:
    """Answers like tritonclient's HTTP client (JSON dicts, no `as_json` argument)."""

    def __init__(self, live=True, models=None):
        self.live = live
        self.models = models or {}

    def is_server_live(self):
        if self.live is None:
            raise ConnectionRefusedError("[Errno 111] Connection refused")
        return self.live

    def is_model_ready(self, name):
        return name in self.models

    def get_model_config(self, name):
        return {"name": name, "model_transaction_policy": {"decoupled": self.models[name]}}

    def get_model_repository_index(self):
        return [{"name": name, "state": "READY"} for name in self.models]


class FakeGrpcClient(FakeClient):
    """Answers like tritonclient's gRPC client asked for JSON."""

    def start_stream(self, callback):
        raise AssertionError("not used")

    def get_model_config(self, name, as_json=False):
        assert as_json
        return {"config": super().get_model_config(name)}

    def get_model_repository_index(self, as_json=False):
        assert as_json
        return {"models": super().get_model_repository_index()}


@pytest.mark.parametrize("client_type", [FakeClient, FakeGrpcClient])
def test_check_server_messages(client_type):
    client = client_type(models={"spark_tts": False, "spark_tts_stream": True})
    assert check_server(client, "h:1", "HTTP", "spark_tts", streaming=False)
    assert check_server(client, "h:1", "gRPC", "spark_tts_stream", streaming=True)
    with pytest.raises(
        ServerCheckError, match=r"model 'nope' is not ready on h:1 \(ready models: spark_tts, "
    ):
        check_server(client, "h:1", "gRPC", "nope", streaming=False)
    with pytest.raises(ServerCheckError, match="not decoupled, so it cannot stream"):
        check_server(client, "h:1", "gRPC", "spark_tts", streaming=True)
    with pytest.raises(ServerCheckError, match="HTTP cannot stream"):
        check_server(client, "h:1", "HTTP", "spark_tts_stream", streaming=False)
    with pytest.raises(ServerCheckError, match="cannot reach Triton at h:1 over HTTP"):
        check_server(client_type(live=None), "h:1", "HTTP", "spark_tts", streaming=False)
