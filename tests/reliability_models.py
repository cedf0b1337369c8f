"""Models and helpers of the reliability suite (tests/test_reliability_*.py, scripts/soak.py).

The suite kills stubs and floods queues, so it serves its own copies of the Spark-TTS models under `rel_*` names
(the other test modules' models on the session server are never touched), and a CosyVoice2 BLS with its own
token2wav (`rel_cosyvoice2`, `rel_cosyvoice2_token2wav`) over the LLM and front end of cosyvoice2_models.
"""

from __future__ import annotations

import queue
import re
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from conftest import PROMPT_ZH_TEXT
from cosyvoice2_models import PREFIX as COSY
from cosyvoice2_models import TEMPLATES as COSY_TEMPLATES
from cosyvoice2_models import bls_values, checkpoint_paths
from http_service import start_python
from spark_models import COMMON, install, install_spark_bls
from waiting import scaled, wait_started, wait_until

from tritontts.spark import tokens

REL = "rel_"
SPARK_STREAM, SPARK_OFFLINE, SPARK_BUSY = REL + "spark_tts", REL + "spark_tts_offline", REL + "spark_tts_busy"
LLM_STREAM, LLM_OFFLINE = REL + "tensorrt_llm", REL + "tensorrt_llm_offline"
TOKENIZER, VOCODER = REL + "audio_tokenizer", REL + "vocoder"
SPARK_MODELS = (TOKENIZER, VOCODER, LLM_STREAM, LLM_OFFLINE, SPARK_STREAM, SPARK_OFFLINE, SPARK_BUSY)
COSY_STREAM, COSY_TOKEN2WAV = REL + "cosyvoice2", REL + "cosyvoice2_token2wav"
COSY_MODELS = (
    COSY + "audio_tokenizer",
    COSY + "speaker_embedding",
    COSY + "tensorrt_llm",
    COSY_TOKEN2WAV,
    COSY_STREAM,
)
MAX_NEW_TOKENS = 300  # 6 s of audio: a stream lasts long enough to be hit mid-way
LLM_SLOTS = 4
BLS_INSTANCES = 2  # rel_spark_tts and rel_spark_tts_offline run 2 requests at once
BUSY_QUEUE = 2  # rel_spark_tts_busy: 1 instance, at most 2 requests waiting; the rest are rejected
BUSY_MAX_NEW_TOKENS = 600  # rel_spark_tts_busy's budget: a request forced to it holds the instance for long
REFERENCE_TEXT = PROMPT_ZH_TEXT[:20]  # about the clip's 3 s: the synthetic LLMs' length follows text vs audio
TARGET = "身临其境，换新体验。塑造开源语音合成新范式，让智能语音更自然。"
QUEUE_POLICY = re.compile(r"(default_queue_policy \{\s*max_queue_size): \d+")


def _bls(
    repo: Path,
    name: str,
    model_dir: Path,
    decoupled: bool,
    llm: str,
    instances: int,
    queue: int,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> None:
    roles = {"tensorrt_llm": llm, "audio_tokenizer": TOKENIZER, "vocoder": VOCODER}
    path = install_spark_bls(repo, name, model_dir, decoupled, roles, instances, max_new_tokens)
    config = path / "config.pbtxt"
    text = config.read_text()
    text, count = QUEUE_POLICY.subn(rf"\1: {queue}", text)
    assert count == 1, "the spark_tts template lost its queue policy"
    config.write_text(text)


def build_reliability_models(repo: Path, data: Path) -> None:
    from tritontts.synthetic.spark import write_spark_checkpoint

    model_dir = write_spark_checkpoint(data / "spark_tiny", preset="tiny", seed=0).resolve()
    front = f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu"
    install("audio_tokenizer", repo, TOKENIZER, f"{front},max_reference_seconds:30")
    install("vocoder", repo, VOCODER, f"{front},cuda_graphs:auto,compile:auto,first_chunk_priority:false")
    for name, decoupled, slots in ((LLM_STREAM, True, LLM_SLOTS), (LLM_OFFLINE, False, 8)):
        install(
            "tensorrt_llm_torch",
            repo,
            name,
            f"model_dir:{model_dir}/LLM,{COMMON},decoupled_mode:{decoupled},llm_max_batch_size:{slots},"
            "llm_max_seq_len:1024,llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false,llm_decode_attention:auto,llm_decode_linear:auto,llm_decode_pdl:auto,llm_stream_interval:auto,"
            f"llm_output_tokens_from:{tokens.OUTPUT_WINDOW_FROM},first_chunk_priority:false,audio_tokens_per_s:25,first_chunk_tokens:18",
        )
    _bls(repo, SPARK_STREAM, model_dir, True, LLM_STREAM, BLS_INSTANCES, 64)
    _bls(repo, SPARK_OFFLINE, model_dir, False, LLM_OFFLINE, BLS_INSTANCES, 64)
    _bls(repo, SPARK_BUSY, model_dir, True, LLM_STREAM, 1, BUSY_QUEUE, BUSY_MAX_NEW_TOKENS)


def build_reliability_cosyvoice2_models(repo: Path, data: Path) -> None:
    """After cosyvoice2_models.build_cosyvoice2_models (its checkpoint, front end and LLM)."""
    paths = checkpoint_paths(data.parent / "build_cosyvoice2_models")
    model_dir, llm_dir = paths.model_dir.resolve(), paths.llm_dir.resolve()
    install(
        "token2wav",
        repo,
        COSY_TOKEN2WAV,
        f"model_dir:{model_dir},{COMMON},device:cpu,dtype:float32,cuda_graphs:auto,flow_compile:false,stream_calls:true,instance_num:1,cuda_graph_batch_sizes:1\\,2,first_chunk_priority:false,first_chunks_first:true,voice_prefix_gib:0",
        COSY_TEMPLATES,
    )
    values = bls_values(model_dir, llm_dir, True, "tensorrt_llm", token2wav=COSY_TOKEN2WAV)
    install("cosyvoice2", repo, COSY_STREAM, values, COSY_TEMPLATES)


def reference_clip(prompt_zh: Path) -> np.ndarray:
    """The suite's reference audio: the first 3 s of the Chinese prompt at 16 kHz."""
    from tritontts.audio import load_wav

    return load_wav(prompt_zh, 16000)[: 16000 * 3]


def voices_folder(folder: Path, prompt_zh: Path) -> Path:
    """`folder` made a speech-API voices folder holding the voice `zh` (the prompt and its transcript)."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(prompt_zh, folder / "zh.wav")
    (folder / "zh.txt").write_text(PROMPT_ZH_TEXT + "\n", encoding="utf-8")  # the whole clip's transcript
    return folder


def api_args(triton_url: str, voices: Path, **models: str) -> list[str]:
    """Speech-API arguments: the Triton URL, the voices folder and a 16 kHz route `name=model` for each."""
    args = ["--triton-url", triton_url, "--voices-dir", str(voices)]
    for name, model in models.items():
        args += ["--model", f"{name}={model},sample_rate=16000"]
    return args


@contextmanager
def speech_api(triton_url: str, tmp_path_factory, prompt_zh: Path, *extra: str, **models: str):
    """The speech API over `models` (see api_args) with the voice `zh`: yields (its URL, the voices folder)."""
    from openai_api_process import api_process

    voices = voices_folder(tmp_path_factory.mktemp("voices"), prompt_zh)
    args = [*api_args(triton_url, voices, **models), *extra]
    with api_process(*args, log_file=tmp_path_factory.mktemp("api") / "api.log") as url:
        yield url, voices


def loaded(*models: str):
    """A module's `server` fixture: the session server with `models` loaded, kept to the session's end (tests
    leave requests queued on them that an unload would wait for)."""

    @pytest.fixture(scope="module")
    def server(triton):
        triton.kept.update(models)
        return triton.load(*models)

    return server


@pytest.fixture(scope="module")
def _reference(prompt_zh):
    return reference_clip(prompt_zh)


def reference_fixture():
    """A module's `reference` fixture: reference_clip of the prompt."""
    return _reference


def spark_arrays(wav: np.ndarray, target: str = TARGET) -> dict[str, np.ndarray]:
    return {
        "reference_wav": wav.reshape(1, -1).astype(np.float32),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
        "reference_text": np.array([[REFERENCE_TEXT.encode()]], dtype=object),
        "target_text": np.array([[target.encode()]], dtype=object),
    }


def read_outcome(stream, timeout: float) -> tuple[str, str]:
    """('ok' | 'error' | 'hang', message) of a triton_stream.Stream: 'hang' when no final response or error
    came within `timeout` seconds of silence."""
    try:
        result = stream.read(timeout=timeout)
    except queue.Empty:
        stream.cancel()
        return "hang", f"nothing for {timeout:.0f} s"
    return ("error", result.error) if result.error else ("ok", f"{len(result.outputs)} chunks")


class WatchdogProcess:
    """`python -m tritontts.triton.watchdog` beside a server, its actions read from its events file."""

    def __init__(self, server, events: Path, action: str = "auto", log: Path | None = None) -> None:
        self.events = events
        command = [sys.executable, "-m", "tritontts.triton.watchdog", "--server-pid", str(server.pid)]
        command += ["--http-url", server.http_url, "--action", action, "--grace", "1", "--poll", "0.5"]
        self.log_path = log or events.with_suffix(".log")
        self.process = start_python([*command, "--events", str(events)], self.log_path)
        wait_started(
            self.process,
            lambda: (b"watching" in self.log_path.read_bytes(), "no 'watching' line in its log yet"),
            "the watchdog",
            self.log_path,
            timeout=60,
        )

    def actions(self) -> list[str]:
        if not self.events.exists():
            return []
        return [line for line in self.events.read_text().splitlines() if line.strip()]

    def wait_for_model(self, model: str, skip: int, timeout: float = 300.0) -> list[dict]:
        """The actions after the first `skip` once one of them is on `model` (or all after `timeout`, scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline and self.process.poll() is None:
            actions = json_lines(self.actions()[skip:])
            if any(a["model"] == model for a in actions):
                return actions
            time.sleep(0.2)
        return json_lines(self.actions()[skip:])

    def wait_quiet(self, quiet_s: float = 5.0, timeout: float = 300.0) -> None:
        """Until no stub has gone missing for `quiet_s` (the watchdog's own log is silent that long; at most
        `timeout` seconds, scaled)."""
        deadline = time.monotonic() + scaled(timeout)
        size, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            text = self.log_path.read_text()
            if len(text) != size:
                size, since = len(text), time.monotonic()
            elif time.monotonic() - since >= quiet_s and "died" not in text.strip().splitlines()[-1]:
                return
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def json_lines(lines: list[str]) -> list[dict]:
    import json

    return [json.loads(line) for line in lines]


def metric_values(server, name: str) -> dict[str, float]:
    """Every sample of the Prometheus metric `name` on the server's metrics port, by its label text."""
    import urllib.request

    url = f"http://127.0.0.1:{server.config.metrics_port}/metrics"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name) :].rpartition(" ")
            values[labels] = float(value)
    return values


def engine_requests(server, model: str) -> dict[str, float]:
    """{'running': n, 'waiting': n} of the torch engine behind `model` (the tritontts_llm_requests gauges)."""
    values = metric_values(server, "tritontts_llm_requests")
    return {
        state: value
        for labels, value in values.items()
        if f'model="{model}"' in labels
        for state in ("running", "waiting")
        if f'state="{state}"' in labels
    }


def wait_engine_idle(server, model: str, timeout: float = 60.0) -> dict[str, float]:
    """The engine's gauges once both read 0; an AssertionError with what they read after `timeout` seconds
    (scaled: waiting.wait_until)."""
    return wait_until(
        lambda: engine_requests(server, model),
        lambda state: bool(state) and not any(state.values()),
        f"the engine of {model} to be idle (tritontts_llm_requests running and waiting 0)",
        timeout=timeout,
        interval=0.5,
    )


RESIDENT_PARTS = {"total": "VmRSS", "anon": "RssAnon", "file": "RssFile", "shmem": "RssShmem"}
"""VmRSS = RssAnon + RssFile + RssShmem (/proc/PID/status). RssAnon: private heap, malloc arenas and stacks.
RssFile: paged-in mapped files (binaries, libraries), bounded by their sizes. RssShmem: touched pages of the python
backend's shared-memory pools (each stub's /dev/shm/triton_python_backend_shm_region_*, mapped into tritonserver
too), bounded by the pools' sizes while no pool grows (shm_pool_bytes)."""


def resident_parts(server_pid: int) -> dict[str, dict[str, int]]:
    """Resident bytes of tritonserver and of each stub (by instance name), by part (RESIDENT_PARTS' keys)."""
    from tritontts.triton.stubs import list_stubs

    def parts(pid: int) -> dict[str, int]:
        fields = {}
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                key, _, value = line.partition(":")
                fields[key] = value
        except OSError:
            pass
        return {
            part: int(fields[key].split()[0]) * 1024 if key in fields else 0
            for part, key in RESIDENT_PARTS.items()
        }

    return {"tritonserver": parts(server_pid)} | {s.instance: parts(s.pid) for s in list_stubs(server_pid)}


def rss_bytes(server_pid: int, part: str = "total") -> dict[str, int]:
    """Resident memory (VmRSS, or one of RESIDENT_PARTS) of tritonserver and of each of its stubs."""
    return {name: parts[part] for name, parts in resident_parts(server_pid).items()}


def shm_pool_bytes(server_pid: int) -> dict[str, int]:
    """The size of each stub's shared-memory pool (by instance name): the python backend grows a full pool by
    shm-growth-byte-size, so a pool larger than it started holds more than the traffic's peak ever needed."""
    from tritontts.triton.stubs import list_stubs

    sizes = {}
    for stub in list_stubs(server_pid):
        try:
            sizes[stub.instance] = Path("/dev/shm", stub.shm_region).stat().st_size
        except (OSError, ValueError):
            pass
    return sizes


def knob(name: str, default: float) -> float:
    """A scale of the suite: CI runs the defaults, scripts/soak.py sets `TRITONTTS_SOAK_<NAME>` to run longer."""
    import os

    return float(os.environ.get(f"TRITONTTS_SOAK_{name.upper()}", default))


def reporting() -> bool:
    """Whether scripts/soak.py collects the figures (`record`): what a scenario only records, it may skip in CI."""
    import os

    return bool(os.environ.get("TRITONTTS_SOAK_REPORT"))


def record(scenario: str, **figures) -> None:
    """Append one scenario's figures to the report scripts/soak.py collects (`TRITONTTS_SOAK_REPORT`)."""
    import json
    import os

    path = os.environ.get("TRITONTTS_SOAK_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"scenario": scenario, **figures}) + "\n")


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = np.sort(np.asarray(values))
    return {f"p{q}": round(float(np.percentile(ordered, q)), 3) for q in (50, 90, 99)} | {
        "max": round(float(ordered[-1]), 3)
    }
