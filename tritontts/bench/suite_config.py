"""What the benchmark suite (tritontts/bench/suite.py) runs and with which settings: its parts and groups, the
device and commit it records, and the suite's configuration."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tritontts.bench import results

REPO = Path(__file__).resolve().parents[2]
FAMILIES = ("spark_tts", "cosyvoice2", "cosyvoice2_dit", "cosyvoice3")
MODES = ("streaming", "offline")
SCRIPT_PARTS = ("engine", "flow_graphs", "dit_flow_graphs", "vocoder_graphs")
SERVING_PARTS = tuple(f"{family}:{mode}" for family in FAMILIES for mode in MODES)
WEBSOCKET_PARTS = tuple(f"{family}:websocket" for family in FAMILIES)
ALL_PARTS = SCRIPT_PARTS + SERVING_PARTS + WEBSOCKET_PARTS
GROUPS = {
    "all": ALL_PARTS,
    "token2wav_graphs": ("flow_graphs", "dit_flow_graphs", "vocoder_graphs"),
    "serving": SERVING_PARTS,
    "websocket": WEBSOCKET_PARTS,
    **{
        family: tuple(p for p in SERVING_PARTS + WEBSOCKET_PARTS if p.startswith(f"{family}:"))
        for family in FAMILIES
    },
    **{mode: tuple(p for p in SERVING_PARTS if p.endswith(f":{mode}")) for mode in MODES},
}
GPU_SERVE_ARGS = "--llm_compile true --llm_max_batch_size 16 --bls_instance_num 16"
FAMILY_NAMES = {
    "spark_tts": "Spark-TTS",
    "cosyvoice2": "CosyVoice2",
    "cosyvoice2_dit": "CosyVoice2-DiT",
    "cosyvoice3": "CosyVoice3",
}
SCRIPT_WHAT = {
    "engine": "Our LLM engine's decode steps and prefill against bench_llm_reference.py and transformers generate "
    "(synthetic weights)",
    "flow_graphs": "CosyVoice2's token2wav eager against graphed: first chunk, 5 s offline, lockstep streams "
    "(synthetic weights)",
    "dit_flow_graphs": "The Step-Audio-2-mini DiT flow eager against graphed (synthetic weights)",
    "vocoder_graphs": "CosyVoice2's HiFT and CosyVoice3's causal HiFT eager against per-length graphs "
    "(synthetic weights)",
}
STOP_TIMEOUT_S = 120


def select_parts(spec: str) -> tuple[str, ...]:
    """Comma-separated part names and groups, in the suite's order; ValueError names what is unknown."""
    wanted: set[str] = set()
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            continue
        if token in ALL_PARTS:
            wanted.add(token)
        elif token in GROUPS:
            wanted.update(GROUPS[token])
        else:
            raise ValueError(
                f"unknown suite part '{token}': parts are {', '.join(ALL_PARTS)}; groups are {', '.join(GROUPS)}"
            )
    if not wanted:
        raise ValueError("no suite part selected")
    return tuple(p for p in ALL_PARTS if p in wanted)


@dataclass(frozen=True)
class Device:
    kind: str  # cuda | cpu
    name: str
    machine_gpus: int = 0

    @property
    def label(self) -> str:
        return results.gpu_label({"gpu_count": int(self.kind == "cuda"), "device": self.name}).lower()


def detect_device(wanted: str = "auto") -> Device:
    """The first GPU that nvidia-smi lists (without touching CUDA), else the CPU; `wanted` cpu forces the CPU."""
    names: list[str] = []
    if wanted != "cpu":
        try:
            done = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if done.returncode == 0:
                names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            pass
    if names:
        return Device("cuda", names[0], len(names))
    if wanted == "cuda":
        raise RuntimeError("--device cuda: nvidia-smi lists no GPU")
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return Device("cpu", f"CPU: {cpu}, {os.cpu_count()} cores")


def detect_commit(repo: Path = REPO) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short=7", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "0000000 (unknown: no git; pass --commit)"
    if head.returncode != 0:
        return "0000000 (unknown: no git checkout; pass --commit)"
    commit = head.stdout.strip()
    return commit + (" with uncommitted changes" if dirty.stdout.strip() else "")


def source_label(model_source: str) -> str:
    if model_source.startswith("synthetic-"):
        return f"{model_source[len('synthetic-') :]}_synthetic"
    return "hub" if model_source in ("huggingface", "modelscope") else "local"


@dataclass(frozen=True)
class SuiteConfig:
    exp_dir: Path = Path("exp")
    out_dir: Path = REPO / "benchmarks"
    parts: tuple[str, ...] = ALL_PARTS
    force: bool = False
    model_source: str = "huggingface"
    llm_backend: str = "torch"
    device: str = "auto"  # auto | cuda | cpu
    python: str = sys.executable
    dataset: str = ""  # "": run.sh's default, <exp_dir>/benchmark_data
    split_name: str = "test"
    sweep: str = "1,4,16"
    warmup: int = 2
    serve_args: str = "auto"  # auto: GPU_SERVE_ARGS on a GPU host, none on the CPU
    part_timeout_s: float = 900.0
    ports: tuple[int, int, int] = (8000, 8001, 8002)
    api_port: int = 8080  # the websocket parts' speech API
    commit: str = "auto"
    reps: int = 10

    def serving_args(self, device: Device) -> list[str]:
        spec = self.serve_args
        if spec == "auto":
            spec = GPU_SERVE_ARGS if device.kind == "cuda" else ""
        return shlex.split(spec)

    def settings(self, part: str, device: Device) -> dict:
        """What a done part was run with: a part done with other settings is run again."""
        common = {"device": device.kind, "gpu": device.name, "model_source": self.model_source}
        if part == "engine":
            return common | {"tiny": self.model_source == "synthetic-tiny"}
        if part in SCRIPT_PARTS:
            return common | {"reps": self.reps}
        served = {
            "llm_backend": self.llm_backend,
            "sweep": self.sweep,
            "serve_args": self.serving_args(device),
        }
        if part.endswith(":websocket"):  # the WebSocket bench sends its own text, no dataset rows
            return common | served
        return common | served | {"dataset": self.dataset, "split": self.split_name, "warmup": self.warmup}


HIDDEN_OPTIONS = (
    "--exp_dir",
    "--python",
    "--http_port",
    "--grpc_port",
    "--metrics_port",
    "--log_dir",
    "--api_port",
    "--voices_dir",
    "--url",
)


def shown_command(argv: list[str], python: str) -> str:
    """argv as the benchmark JSON records it: `python` for the interpreter, without the options that place
    files and ports (they change no figure), an output file by its name alone."""
    shown, skip = [], False
    for index, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg in HIDDEN_OPTIONS:
            skip = True
        elif index and argv[index - 1] in ("--out", "--output"):
            shown.append(Path(arg).name)
        else:
            shown.append("python" if arg == python else arg)
    return shlex.join(shown)
