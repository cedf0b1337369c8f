"""The real tritonserver: bundle preparation, tensors over HTTP/gRPC, decoupled streams, errors, start/stop."""

from __future__ import annotations

import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from triton_stubs import signal_stub

from tritontts.triton import bundle, params
from tritontts.triton.bundle import STUB_NAME, find_tritonserver, prepare_pytriton_bundle, pytriton_bundle_dir
from tritontts.triton.server import ServerConfig, ServerError, TritonServer, free_ports, is_tritonserver

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = Path(__file__).parent / "triton_models"


def copy_stream_model(repo: Path, data_dir: Path) -> None:
    """The callable form of a TRITON_MODELS entry (later suites fill templates here)."""
    shutil.copytree(MODELS / "infra_stream", repo / "infra_stream")


TRITON_MODELS = [MODELS / "infra_echo", copy_stream_model]
TEXT = "héllo, wörld: 你好 ${not_a_placeholder}"

needs_bundle = pytest.mark.skipif(pytriton_bundle_dir() is None, reason="nvidia-pytriton is not installed")


@pytest.fixture(scope="module")
def server(triton):
    return triton.load("infra_echo", "infra_stream")


def echo_inputs(module, x: np.ndarray, text: str) -> list:
    x_input = module.InferInput("X", list(x.shape), "FP32")
    x_input.set_data_from_numpy(x)
    text_input = module.InferInput("TEXT", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return [x_input, text_input]


def stream_inputs(module, count: int, text: str) -> list:
    count_input = module.InferInput("COUNT", [1], "INT32")
    count_input.set_data_from_numpy(np.array([count], dtype=np.int32))
    text_input = module.InferInput("TEXT", [1], "BYTES")
    text_input.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return [count_input, text_input]


def children_of(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


# --- params helpers, in plain Python -------------------------------------------------------------------------


class FakeTensor:
    def __init__(self, array):
        self.array = array

    def as_numpy(self):
        return self.array


class FakePbUtils:
    """The parts of triton_python_backend_utils the helpers touch."""

    class TritonError:
        INTERNAL, INVALID_ARG = 13, 3

        def __init__(self, message, code=13):
            self.message, self.code = message, code

    class InferenceResponse:
        def __init__(self, output_tensors=(), error=None):
            self.output_tensors, self.error = output_tensors, error

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return FakeTensor(request[name]) if name in request else None


def config_with(**values) -> dict:
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in values.items()}}


def test_model_param_parses_types_and_defaults():
    config = config_with(rate="1.5", n="16", on="True", off="no", path="/a:b", unfilled="${x}")
    assert params.model_param(config, "rate", float) == 1.5
    assert params.model_param(json.dumps(config), "n", int) == 16
    assert params.model_param(config, "on", bool) is True
    assert params.model_param(config, "off", bool) is False
    assert params.model_param(config, "path") == "/a:b"
    assert params.model_param(config, "missing", int, default=3) == 3
    assert params.model_param(config, "unfilled", default="d") == "d"


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [("missing", str, "'missing' is not set"), ("unfilled", str, "'unfilled' was not filled in"),
     ("n", int, "'n' = '1.5' is not a valid int"), ("flag", bool, "'flag' = 'maybe' is not a valid bool")],
)  # fmt: skip
def test_model_param_errors_name_the_parameter(name, kind, expected):
    config = config_with(n="1.5", flag="maybe", unfilled="${unfilled}")
    with pytest.raises(params.ParameterError, match=expected):
        params.model_param(config, name, kind)


def test_input_helpers_validate_and_name_the_field():
    pb = FakePbUtils
    request = {
        "X": np.zeros((2, 3), np.float32),
        "T": np.array([b"caf\xc3\xa9"], dtype=object),
        "B": np.array([b"\xff"], dtype=object),
    }
    assert params.required_input(pb, request, "X", dtype=np.float32, ndim=2).shape == (2, 3)
    assert params.optional_input(pb, request, "nope") is None
    assert params.string_input(pb, request, "T") == "café"
    assert params.string_input(pb, request, "nope", default="d") == "d"
    cases = [
        (partial(params.required_input, pb, request, "nope"), "nope: is required"),
        (partial(params.required_input, pb, request, "X", dtype=np.int32), "X: must be int32, got float32"),
        (
            partial(params.required_input, pb, request, "X", ndim=1),
            r"X: must have 1 dimensions, got shape \[2, 3\]",
        ),
        (partial(params.string_input, pb, request, "B"), "B: must be UTF-8 text"),
        (partial(params.string_input, pb, request, "X"), "X: must hold 1 string"),
    ]
    for call, message in cases:
        with pytest.raises(params.RequestError, match=message):
            call()


def test_error_response_codes():
    reply = params.error_response(FakePbUtils, params.RequestError("TEXT", "is empty"))
    assert (reply.error.message, reply.error.code) == ("TEXT: is empty", FakePbUtils.TritonError.INVALID_ARG)
    reply = params.error_response(FakePbUtils, KeyError("k"))
    assert reply.error.code == FakePbUtils.TritonError.INTERNAL and "KeyError" in reply.error.message
    assert str(params.RequestError("f", "bad")) == "f: bad" and params.RequestError("f", "bad").field == "f"

    class OtherRequestError(ValueError):
        field = "reference_wav"

    reply = params.error_response(FakePbUtils, OtherRequestError("reference_wav: too long"))
    assert (reply.error.message, reply.error.code) == (
        "reference_wav: too long",
        FakePbUtils.TritonError.INVALID_ARG,
    )


# --- bundle ----------------------------------------------------------------------------------------------------


def test_tritonserver_on_path_is_preferred(tmp_path, monkeypatch):
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    install = find_tritonserver()
    assert (install.binary, install.source, install.server_args()) == (fake, "PATH", [])
    assert install.environment({"PATH": "/p"}) == {"PATH": "/p"}


def test_no_tritonserver_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(bundle, "CONTAINER_BINARY", tmp_path / "none")
    monkeypatch.setattr(bundle, "pytriton_bundle_dir", lambda: None)
    with pytest.raises(bundle.TritonNotFoundError, match="nvidia-pytriton"):
        bundle.find_tritonserver()


@needs_bundle
def test_bundle_installs_stub_and_sets_environment():
    if os.environ.get(bundle.STUB_ENV):
        pytest.skip(
            f"{bundle.STUB_ENV} is set: this checks the wheel's own stub, which the session does not run"
        )
    install = find_tritonserver(prefer_path=False)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = install.backend_dir / "python" / STUB_NAME
    assert (
        stub.read_bytes()
        == (pytriton_bundle_dir() / "python_backend_stubs" / version / STUB_NAME).read_bytes()
    )
    env = install.environment({"PATH": "/usr/bin", "PYTHONHOME": "/nowhere", "LD_LIBRARY_PATH": "/x"})
    assert env["PATH"].split(":")[0] == install.path_prepend[0]
    assert (Path(install.path_prepend[0]) / "python3").exists()
    assert env["LD_LIBRARY_PATH"].split(":")[-1] == "/x" and "nvidia_pytriton.libs" in env["LD_LIBRARY_PATH"]
    assert "PYTHONHOME" not in env
    assert find_tritonserver(prefer_path=False) == install  # idempotent


@needs_bundle
def test_private_backend_tree(tmp_path):
    install = prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path, in_place=False)
    python_dir = install.backend_dir / "python"
    assert python_dir.is_relative_to(tmp_path)
    assert (python_dir / "libtriton_python.so").is_symlink() and (python_dir / STUB_NAME).is_file()
    assert prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path, in_place=False) == install


def test_a_stub_named_by_the_environment_replaces_the_wheels(tmp_path, monkeypatch):
    from tritontts.triton.bundle import STUB_ENV

    shipped = pytriton_bundle_dir() / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
    custom = tmp_path / "stub_r24.12"
    custom.write_bytes((shipped / STUB_NAME).read_bytes() + b"\0")  # trailing bytes: still the same program
    monkeypatch.setenv(STUB_ENV, str(custom))
    install = prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path, in_place=False)
    assert (install.backend_dir / "python" / STUB_NAME).read_bytes() == custom.read_bytes()
    monkeypatch.setenv(STUB_ENV, str(tmp_path / "missing"))
    with pytest.raises(bundle.TritonNotFoundError, match=STUB_ENV):
        prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path, in_place=False)
    other_python = tmp_path / "stub_py3.99"
    other_python.write_bytes(b"\x7fELF...libpython3.99.so.1.0\0...")
    monkeypatch.setenv(STUB_ENV, str(other_python))
    with pytest.raises(
        bundle.TritonNotFoundError, match=r"built for Python 3\.99, not this interpreter's 3\.\d+"
    ):
        prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path / "other", in_place=False)
    assert not (tmp_path / "other").exists()


# --- the session server --------------------------------------------------------------------------------------


@pytest.mark.triton
def test_http_tensors_arrive_intact(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    x = np.linspace(-3, 3, 10_000, dtype=np.float32)
    result = client.infer("infra_echo", echo_inputs(httpclient, x, TEXT))
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
    assert result.as_numpy("TEXT_OUT")[0].decode() == TEXT
    assert int(result.as_numpy("NUMPY_VERSION")[0].decode().split(".")[0]) < 2
    # the stub runs this interpreter's own libpython and this environment's site-packages
    assert [v.decode() for v in result.as_numpy("PYTHON")] == [platform.python_version(), sys.prefix]


@pytest.mark.triton
def test_python_stubs_start_with_the_configured_shared_memory_pool(server):
    from tritontts.triton.server import PYTHON_SHM_BYTES, PYTHON_SHM_GROWTH_BYTES

    stubs = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args[0].endswith(STUB_NAME.encode()) and str(server.server.pid).encode() in args:
            stubs.append([a.decode() for a in args])
    assert stubs
    # the stub's arguments: model.py, shm region name, its initial size, its growth step, parent pid, ...
    assert all(args[3:5] == [str(PYTHON_SHM_BYTES), str(PYTHON_SHM_GROWTH_BYTES)] for args in stubs)


@pytest.mark.triton
def test_grpc_tensors_arrive_intact(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = np.array([0.5, -1.25, 3e5], dtype=np.float32)
    result = client.infer("infra_echo", echo_inputs(grpcclient, x, TEXT))
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2)
    assert result.as_numpy("TEXT_OUT")[0].decode() == TEXT


@pytest.mark.triton
def test_model_error_names_the_field_and_server_keeps_serving(server):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.http_url)
    with pytest.raises(InferenceServerException, match="X: must be finite") as caught:
        client.infer("infra_echo", echo_inputs(httpclient, np.array([1.0, np.nan], np.float32), "t"))
    assert caught.value.status() == "400"  # INVALID_ARG, not an internal error
    result = client.infer("infra_echo", echo_inputs(httpclient, np.ones(2, np.float32), "ok"))
    assert result.as_numpy("TEXT_OUT")[0] == b"ok"


def run_stream(grpc_url: str, requests: list[tuple[int, str]]) -> list[list]:
    """Send (count, text) requests on one gRPC stream; returns per request its results/errors up to the final."""
    import tritonclient.grpc as grpcclient

    replies: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: replies.put((result, error)))
    per_request: dict[str, list] = {}
    try:
        for number, (count, text) in enumerate(requests):
            client.async_stream_infer(
                "infra_stream", stream_inputs(grpcclient, count, text), request_id=str(number),
                enable_empty_final_response=True,
            )  # fmt: skip
            done = False
            while not done:
                result, error = replies.get(timeout=30)
                if error is not None:
                    per_request.setdefault(str(number), []).append(error)
                    done = True
                    continue
                response = result.get_response()
                final = response.parameters["triton_final_response"].bool_param
                if response.outputs:
                    per_request.setdefault(response.id, []).append(result)
                done = final
    finally:
        client.stop_stream()
        client.close()
    return [per_request.get(str(n), []) for n in range(len(requests))]


@pytest.mark.triton
def test_decoupled_stream_sends_all_responses_then_final(server):
    five, none, bad, again = run_stream(server.grpc_url, [(5, TEXT), (0, "x"), (-1, "x"), (2, "y")])
    assert [int(r.as_numpy("INDEX")[0]) for r in five] == [0, 1, 2, 3, 4]
    for index, result in enumerate(five):
        np.testing.assert_array_equal(result.as_numpy("CHUNK"), np.arange(index + 1, dtype=np.float32) * 0.5)
        assert result.as_numpy("TEXT_OUT")[0].decode() == f"{TEXT}#{index}"
    assert none == []
    assert len(bad) == 1 and "COUNT: must be >= 0" in str(bad[0])
    assert [r.as_numpy("TEXT_OUT")[0] for r in again] == [b"y#0", b"y#1"]


# --- own servers: failure, stop, CLI --------------------------------------------------------------------------


def own_config(tmp_path: Path, repo: Path, **overrides) -> ServerConfig:
    http_port, grpc_port, metrics_port = free_ports(3)
    return ServerConfig(
        model_repo=repo, http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
        log_file=tmp_path / "server.log", pid_file=tmp_path / "server.pid", **overrides,
    )  # fmt: skip


@pytest.mark.triton
def test_wait_ready_fails_fast_with_the_model_error(tmp_path):
    broken = tmp_path / "repo" / "broken" / "1"
    broken.mkdir(parents=True)
    (broken.parent / "config.pbtxt").write_text(
        (MODELS / "infra_echo" / "config.pbtxt").read_text().replace("infra_echo", "broken")
    )
    (broken / "model.py").write_text("raise RuntimeError('broken on purpose')\n")
    server = TritonServer(own_config(tmp_path, tmp_path / "repo"))
    server.start()
    started = time.monotonic()
    with pytest.raises(ServerError, match="broken on purpose"):
        server.wait_ready(timeout=120)
    assert time.monotonic() - started < 60
    server.stop()


@needs_bundle
@pytest.mark.triton
def test_stop_ends_server_and_its_stubs_private_tree(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "infra_echo").symlink_to(MODELS / "infra_echo")
    install = prepare_pytriton_bundle(pytriton_bundle_dir(), cache_dir=tmp_path / "cache", in_place=False)
    config = own_config(tmp_path, repo)
    with TritonServer(config, install=install) as server:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url)
        result = client.infer("infra_echo", echo_inputs(httpclient, np.ones(3, np.float32), "private"))
        assert result.as_numpy("TEXT_OUT")[0] == b"private"
        client.close()  # an open connection holds the server's exit for up to --exit-timeout-secs
        pid, stubs = server.pid, children_of(server.pid)
        assert int(config.pid_file.read_text()) == pid and stubs
    assert server.process.returncode is not None and not alive(pid)
    deadline = time.monotonic() + 10
    while any(alive(s) for s in stubs) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(s) for s in stubs)
    assert not config.pid_file.exists()


@pytest.mark.triton
def test_cli_start_status_stop(tmp_path):
    repo = tmp_path / "empty_repo"
    repo.mkdir()
    http_port, grpc_port, metrics_port = free_ports(3)
    files = ["--pid-file", str(tmp_path / "s.pid"), "--log-file", str(tmp_path / "s.log")]
    cli = [sys.executable, str(REPO_ROOT / "scripts" / "triton_server.py")]

    def run(*args):
        return subprocess.run(
            [*cli, *args, *files], capture_output=True, text=True, timeout=120, cwd=tmp_path
        )

    started = run("start", "--model-repo", str(repo), "--http-port", str(http_port), "--grpc-port", str(grpc_port),
                  "--metrics-port", str(metrics_port), "--timeout", "60")  # fmt: skip
    assert started.returncode == 0, started.stdout + started.stderr
    assert f"http 127.0.0.1:{http_port}" in started.stdout and f"grpc 127.0.0.1:{grpc_port}" in started.stdout
    pid = int((tmp_path / "s.pid").read_text())
    assert is_tritonserver(pid)
    status = run("status", "--http-port", str(http_port))
    assert status.returncode == 0 and "ready" in status.stdout
    again = run("start", "--model-repo", str(repo), "--http-port", str(http_port))
    assert again.returncode == 1 and "already running" in again.stderr
    stopped = run("stop", "--grace", "0")  # SIGTERM, then at once SIGKILL of its session
    assert stopped.returncode == 0 and str(pid) in stopped.stdout
    assert not is_tritonserver(pid) and not (tmp_path / "s.pid").exists()
    assert run("status").returncode == 3
    assert run("stop").returncode == 0


@pytest.mark.triton
def test_cli_start_fails_on_missing_repo(tmp_path):
    cli = [
        sys.executable,
        str(REPO_ROOT / "scripts" / "triton_server.py"),
        "start",
        "--model-repo",
        str(tmp_path / "nope"),
    ]
    result = subprocess.run(
        [*cli, "--pid-file", str(tmp_path / "p")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and "model repository not found" in result.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.triton
def test_a_stub_killed_by_a_fatal_signal_prints_its_stacks_to_the_server_log(tmp_path):
    """On a server of its own: tritonserver 2.51 can abort later on a killed stub's pool lock (at its unload,
    say), which must not take the session's server with it (docs/tests.md)."""
    import signal

    import tritonclient.http as httpclient
    from conftest import start_explicit_server

    repo = tmp_path / "model_repo"
    repo.mkdir()
    (repo / "infra_fatal").symlink_to(MODELS / "infra_fatal", target_is_directory=True)
    server = start_explicit_server(repo, tmp_path / "tritonserver.log")
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("infra_fatal")
        client.close()
        expect = "Fatal Python error: Segmentation fault"
        added = signal_stub(server, "infra_fatal", signal.SIGSEGV, expect)
    finally:
        server.stop(grace_s=15)
    assert expect in added, added[-2000:]
