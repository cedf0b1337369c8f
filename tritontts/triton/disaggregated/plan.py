"""What a multi-server deployment runs, with its GPUs, ports, command lines and environments: disaggregated, one
LLM server and N token2wav tritonservers; or co-located (data parallel), N tritonservers each serving the whole
pipeline, its LLM inside Triton, and no LLM server. Nothing here starts a process.

Token2wav server `i` listens on `base + 1 + i` for each of http, grpc and metrics (upstream's run.sh starts
them on 17001.., 18001.., 16001..). Servers are numbered instance-major: the first instance on every GPU,
then the second, so that a client sending worker `w` to server `w mod n` busies every GPU before doubling up.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tritontts.triton.bundle import TritonInstall
from tritontts.triton.server import LOOPBACK, ServerConfig, TritonServer, client_host

LLM_BACKENDS = ("torch", "trtllm")
LLM_DEVICES = ("auto", "cuda", "cpu")
LLM_DTYPES = ("auto", "float32", "bfloat16", "float16")
TRTLLM_SERVE = "trtllm-serve"
CHAT_PATH = "/v1/chat/completions"
MAX_PORT = 65535


class PlanError(ValueError):
    """A topology that cannot run: a bad GPU list, clashing ports, a missing checkpoint or program."""


def parse_gpus(text: str, option: str) -> tuple[str, ...]:
    """`0,1` as ('0', '1'): CUDA_VISIBLE_DEVICES entries (indices or GPU UUIDs), each once."""
    gpus = tuple(g.strip() for g in text.split(","))
    if not text.strip() or any(not g or any(c.isspace() for c in g) for g in gpus):
        raise PlanError(f"{option} must be comma-separated GPU indices such as 0,1; got {text!r}")
    if len(set(gpus)) != len(gpus):
        raise PlanError(f"{option} names a GPU twice: {text!r}")
    return gpus


@dataclass(frozen=True)
class PortBases:
    http: int = 17000
    grpc: int = 18000
    metrics: int = 16000


@dataclass(frozen=True)
class LLMServerPlan:
    """The OpenAI-compatible LLM server: ours (`torch`) or TensorRT-LLM's `trtllm-serve` (`trtllm`)."""

    backend: str
    model_dir: Path
    """the Hugging Face LLM directory (weights for torch, tokenizer for trtllm)"""
    gpus: tuple[str, ...]
    port: int
    address: str = LOOPBACK
    engine_dir: Path | None = None
    """trtllm: the engines trtllm-build wrote"""
    max_batch_size: int = 64
    max_seq_len: int = 2560
    device: str = "auto"
    dtype: str = "auto"
    cuda_graphs: bool = True
    compile: bool = False
    kv_cache_free_gpu_memory_fraction: float = 0.4
    command_prefix: tuple[str, ...] = ()
    """trtllm: what runs trtllm-serve, e.g. upstream's `mpirun -np 1 --allow-run-as-root --oversubscribe`"""
    extra_args: tuple[str, ...] = ()
    python: str = sys.executable

    def __post_init__(self) -> None:
        if self.backend not in LLM_BACKENDS:
            raise PlanError(f"llm backend must be one of {LLM_BACKENDS}, not {self.backend!r}")
        if self.device not in LLM_DEVICES:
            raise PlanError(f"llm device must be one of {LLM_DEVICES}, not {self.device!r}")
        if self.dtype not in LLM_DTYPES:
            raise PlanError(f"llm dtype must be one of {LLM_DTYPES}, not {self.dtype!r}")
        if self.max_batch_size < 1:
            raise PlanError(f"llm max batch size must be at least 1, not {self.max_batch_size}")
        if self.backend == "trtllm" and self.engine_dir is None:
            raise PlanError("llm backend trtllm needs the engine directory (--llm-engine-dir)")

    @property
    def url(self) -> str:
        return f"http://{client_host(self.address)}:{self.port}"

    @property
    def chat_url(self) -> str:
        return self.url + CHAT_PATH

    def command(self) -> list[str]:
        return self._trtllm_command() if self.backend == "trtllm" else self._torch_command()

    def _torch_command(self) -> list[str]:
        cmd = [self.python, "-m", "tritontts.llm.openai_server", "--model-dir", str(self.model_dir)]
        cmd += ["--host", self.address, "--port", str(self.port)]
        cmd += ["--max-batch-size", str(self.max_batch_size), "--max-seq-len", str(self.max_seq_len)]
        cmd += ["--dtype", self.dtype]
        if self.device != "auto":
            cmd += ["--device", self.device]
        cmd.append("--cuda-graphs" if self.cuda_graphs else "--no-cuda-graphs")
        if self.compile:
            cmd.append("--compile")
        return cmd + list(self.extra_args)

    def _trtllm_command(self) -> list[str]:
        cmd = [*self.command_prefix, TRTLLM_SERVE, "serve", str(self.engine_dir)]
        cmd += ["--tokenizer", str(self.model_dir)]
        cmd += ["--max_batch_size", str(self.max_batch_size)]
        cmd += ["--kv_cache_free_gpu_memory_fraction", str(self.kv_cache_free_gpu_memory_fraction)]
        cmd += ["--host", self.address, "--port", str(self.port)]
        return cmd + list(self.extra_args)

    def environment(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        return env

    def check_runnable(self, env: Mapping[str, str] | None = None) -> None:
        """PlanError when the checkpoint, the engines or the programs this command runs are missing."""
        path = (env or os.environ).get("PATH")
        if self.backend == "trtllm":
            if shutil.which(TRTLLM_SERVE, path=path) is None:
                raise PlanError(
                    "trtllm-serve is not on PATH: llm backend trtllm serves the LLM with TensorRT-LLM's "
                    "trtllm-serve, which runs only where TensorRT-LLM is installed (NVIDIA's "
                    "tritonserver:<ver>-trtllm-python-py3 container); use llm backend torch elsewhere"
                )
            if self.command_prefix and shutil.which(self.command_prefix[0], path=path) is None:
                raise PlanError(
                    f"{self.command_prefix[0]} (the command prefix of trtllm-serve) is not on PATH; "
                    "an empty prefix runs trtllm-serve directly"
                )
            if not (Path(self.engine_dir) / "config.json").is_file():
                raise PlanError(f"no TensorRT-LLM engine in {self.engine_dir} (run.sh stage 1 builds it)")
        if not (Path(self.model_dir) / "config.json").is_file():
            raise PlanError(f"no LLM checkpoint in {self.model_dir} (run.sh stage 0 writes it)")


@dataclass(frozen=True)
class Token2wavServerPlan:
    """One tritonserver on one GPU: of the token2wav tier, or (co-located) a whole pipeline."""

    index: int
    gpu: str
    instance: int
    http_port: int
    grpc_port: int
    metrics_port: int
    address: str = LOOPBACK
    role: str = "token2wav"
    extra_args: tuple[str, ...] = ()
    """more tritonserver arguments; `{server}` in one becomes this server's name (a trace file each, say)"""

    @property
    def name(self) -> str:
        return f"{self.role}_{self.index}"

    @property
    def grpc_url(self) -> str:
        return f"{client_host(self.address)}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{client_host(self.address)}:{self.http_port}"

    def server_config(self, model_repo: Path, run_dir: Path) -> ServerConfig:
        return ServerConfig(
            model_repo=model_repo,
            http_port=self.http_port,
            grpc_port=self.grpc_port,
            metrics_port=self.metrics_port,
            address=self.address,
            log_file=run_dir / f"{self.name}.log",
            pid_file=run_dir / f"{self.name}.pid",
            extra_args=tuple(arg.replace("{server}", self.name) for arg in self.extra_args),
        )

    def command(self, model_repo: Path, run_dir: Path, install: TritonInstall) -> list[str]:
        return TritonServer(self.server_config(model_repo, run_dir), install).command()

    def environment(self, install: TritonInstall, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = install.environment(base)
        env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env


@dataclass(frozen=True)
class Topology:
    llm: LLMServerPlan | None
    """None: co-located, every server's repository holds the LLM (data parallel)"""
    model_repo: Path
    token2wav_gpus: tuple[str, ...]
    instances_per_gpu: int = 2
    bases: PortBases = field(default_factory=PortBases)
    address: str = LOOPBACK
    server_extra_args: tuple[str, ...] = ()
    """more arguments for every tritonserver (see Token2wavServerPlan.extra_args)"""

    def __post_init__(self) -> None:
        if not self.token2wav_gpus:
            raise PlanError("token2wav GPUs: give at least one")
        if self.instances_per_gpu < 1:
            raise PlanError(f"instances per GPU must be at least 1, not {self.instances_per_gpu}")
        ports = self.ports()
        bad = [p for p in ports if not 0 < p <= MAX_PORT]
        if bad:
            raise PlanError(f"port {bad[0]} is out of range: lower the base ports")
        clashes = sorted({p for p in ports if ports.count(p) > 1})
        if clashes:
            llm_port = "none" if self.llm is None else self.llm.port
            raise PlanError(
                f"port {clashes[0]} would serve twice (LLM port {llm_port}, server bases "
                f"http {self.bases.http} grpc {self.bases.grpc} metrics {self.bases.metrics}, "
                f"{len(self.servers())} servers): pick bases further apart"
            )

    def servers(self) -> list[Token2wavServerPlan]:
        servers = []
        for instance in range(self.instances_per_gpu):
            for gpu in self.token2wav_gpus:
                offset = len(servers) + 1
                servers.append(
                    Token2wavServerPlan(
                        index=len(servers),
                        gpu=gpu,
                        instance=instance,
                        http_port=self.bases.http + offset,
                        grpc_port=self.bases.grpc + offset,
                        metrics_port=self.bases.metrics + offset,
                        address=self.address,
                        role=self.layout_role,
                        extra_args=self.server_extra_args,
                    )
                )
        return servers

    def ports(self) -> list[int]:
        """Every port the deployment listens on: the LLM server's, then each tritonserver's http, grpc, metrics."""
        ports = [] if self.llm is None else [self.llm.port]
        for server in self.servers():
            ports += [server.http_port, server.grpc_port, server.metrics_port]
        return ports

    @property
    def layout(self) -> str:
        return "co-located" if self.llm is None else "disaggregated"

    @property
    def layout_role(self) -> str:
        return "triton" if self.llm is None else "token2wav"

    @property
    def gpus(self) -> list[str]:
        """Every GPU of the deployment once, the LLM's first."""
        llm_gpus = () if self.llm is None else self.llm.gpus
        return list(dict.fromkeys([*llm_gpus, *self.token2wav_gpus]))


def split_args(text: str) -> tuple[str, ...]:
    """A shell-quoted argument string (a run.sh option) as a tuple of arguments."""
    return tuple(shlex.split(text))


def describe(topology: Topology, run_dir: Path, install: TritonInstall | None) -> dict:
    """The topology as JSON-ready data: every command line, device and port (what `start --dry-run` prints)."""
    servers = []
    for server in topology.servers():
        entry = {
            "name": server.name,
            "gpu": server.gpu,
            "instance": server.instance,
            "http_port": server.http_port,
            "grpc_port": server.grpc_port,
            "metrics_port": server.metrics_port,
            "grpc_url": server.grpc_url,
            "http_url": server.http_url,
            "log": str(run_dir / f"{server.name}.log"),
            "pid_file": str(run_dir / f"{server.name}.pid"),
        }
        if install is not None:
            entry["command"] = server.command(topology.model_repo, run_dir, install)
        servers.append(entry)
    llm = topology.llm
    return {
        "layout": topology.layout,
        "model_repo": str(Path(topology.model_repo).resolve()),
        "gpus": topology.gpus,
        "num_gpus": len(topology.gpus),
        "llm": None
        if llm is None
        else {
            "backend": llm.backend,
            "gpus": list(llm.gpus),
            "port": llm.port,
            "url": llm.url,
            "chat_url": llm.chat_url,
            "command": llm.command(),
            "log": str(run_dir / "llm.log"),
            "pid_file": str(run_dir / "llm.pid"),
        },
        "servers": servers,
    }


def server_addrs(servers: Sequence[Mapping]) -> str:
    """The grpc URLs of described servers as client_grpc.py's `--server-addrs` value."""
    return ",".join(server["grpc_url"] for server in servers)
