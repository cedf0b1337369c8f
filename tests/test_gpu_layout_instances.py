"""One tritonserver whose instance groups span GPUs (`run.sh --gpus 0,1 --gpu_layout instances`), on the CPU:
the device a python model's instance picks from its `initialize` args (tritontts.triton.instance_device, with
torch.cuda.set_device mocked), the KIND_GPU groups stage 2 writes (tritontts.triton.instance_group), the one server
stage 3 starts (a stand-in python records what run.sh runs), and the values run.sh refuses. No tritonserver loads
a KIND_GPU instance here: this machine has no GPU."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritontts.triton import instance_device as instance_device_module
from tritontts.triton.batched_flow import flow_placement
from tritontts.triton.instance_device import instance_device
from tritontts.triton.instance_group import parse_gpus, spread_over_gpus
from tritontts.triton.params import stream_instances

ROOT = Path(__file__).resolve().parents[1]
GPU_ARGS = {"model_instance_kind": "GPU", "model_instance_device_id": "2"}
CPU_ARGS = {"model_instance_kind": "CPU", "model_instance_device_id": "0"}


@pytest.fixture
def set_device(monkeypatch) -> list:
    """torch.cuda.set_device, recorded instead of called (no CUDA here)."""
    calls: list = []
    monkeypatch.setattr(instance_device_module.torch.cuda, "set_device", calls.append)
    return calls


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_a_cpu_instance_keeps_the_device_the_model_chose(set_device, device):
    for args in (CPU_ARGS, {}):  # {}: args without the instance keys (tests' stand-ins)
        assert instance_device(args, device) == torch.device(device if device != "auto" else "cpu")
    assert set_device == []


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:0", torch.device("cuda")])
def test_a_gpu_instance_runs_on_its_own_gpu_made_current(set_device, device):
    assert instance_device(GPU_ARGS, device) == torch.device("cuda", 2)
    assert set_device == [2]


def test_a_gpu_instance_of_a_cpu_model_stays_on_the_cpu(set_device):
    assert instance_device(GPU_ARGS, "cpu") == torch.device("cpu")
    assert set_device == []


@pytest.mark.parametrize(
    "args, device, message",
    [
        (GPU_ARGS, "tpu", "device must be 'auto', 'cpu' or"),
        ({"model_instance_kind": "GPU"}, "auto", "needs a GPU index in model_instance_device_id"),
    ],
)
def test_a_gpu_instance_refuses_what_names_no_device(set_device, args, device, message):
    with pytest.raises(ValueError, match=message):
        instance_device(args, device)
    assert set_device == []


def _config(**parameters: str) -> dict:
    return {"name": "token2wav", "parameters": {k: {"string_value": v} for k, v in parameters.items()}}


def test_flow_models_place_their_flow_on_the_instance_gpu(set_device):
    device, dtype, graphs = flow_placement(_config(device="auto"), GPU_ARGS)
    assert (device, dtype, set_device) == (torch.device("cuda", 2), torch.float16, [2])
    assert graphs is not None and graphs.batch_sizes == (1, 2, 4, 8)  # auto: graphs on CUDA
    assert flow_placement(_config(device="auto"), CPU_ARGS) == (torch.device("cpu"), torch.float32, None)


def test_the_spark_vocoder_model_builds_its_codec_on_the_instance_gpu(set_device, monkeypatch):
    built = {}

    class Codec:
        def __init__(self, model_dir, device, with_tokenizer, cuda_graphs, compile_vocoder):
            built.update(model_dir=model_dir, device=device, cuda_graphs=cuda_graphs, compile=compile_vocoder)
            self.detokenizer = types.SimpleNamespace(warm=lambda: 0)

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb_utils_stand_in"))
    spec = importlib.util.spec_from_file_location("vocoder_model", ROOT / "model_repo/vocoder/1/model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "SparkCodec", Codec)
    config = '{"name": "vocoder", "parameters": {"model_dir": {"string_value": "/ckpt"}}}'
    module.TritonPythonModel().initialize({**GPU_ARGS, "model_config": config})
    assert built == {
        "model_dir": "/ckpt",
        "device": torch.device("cuda", 2),
        "cuda_graphs": True,
        "compile": False,  # the `compile` parameter's default
    }
    assert set_device == [2]


def test_every_model_that_reads_a_device_asks_its_instance():
    """A model.py that reads the `device` parameter passes it through instance_device (or flow_placement)."""
    files = {p.resolve() for p in ROOT.glob("model_repo*/*/1/model.py")}
    readers = [p for p in files if '"device"' in p.read_text() or "flow_placement" in p.read_text()]
    assert (
        len(readers) == 9
    )  # LLM; Spark tokenizer, vocoder; CosyVoice tokenizer, CAMPPlus, 3 token2wav, vocoder
    for path in readers:
        text = path.read_text()
        assert "instance_device(args, " in text or "flow_placement(config, args" in text, path


def test_stream_instances_counts_a_gpu_group_on_each_gpu():
    group = {"count": 2, "kind": "KIND_GPU", "gpus": [0, 1, 2]}
    assert stream_instances({"instance_group": [group]}) == 6
    assert stream_instances({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}) == 2
    assert stream_instances({"instance_group": [group], "sequence_batching": {"oldest": {}}}) == 1


def test_spread_over_gpus_rewrites_the_one_cpu_group():
    config = 'name: "m"\ninstance_group [\n  { count: 3, kind: KIND_CPU }\n]\nparameters []\n'
    spread = spread_over_gpus(config, [0, 1])
    assert "{ count: 3, kind: KIND_GPU, gpus: [ 0, 1 ] }" in spread and spread.endswith("parameters []\n")
    parsed = text_format.Parse(spread, model_config_pb2.ModelConfig())
    (group,) = parsed.instance_group
    assert (group.count, group.kind, list(group.gpus)) == (3, group.KIND_GPU, [0, 1])
    with pytest.raises(ValueError, match="no 'instance_group"):
        spread_over_gpus(spread, [0, 1])
    assert parse_gpus("0,2") == [0, 2]
    for bad in ("", "0,", "a", "0,0"):
        with pytest.raises(ValueError):
            parse_gpus(bad)


def _stage_2(tmp_path: Path, model: str, *options: str) -> dict:
    """Stage 2 into a fresh exp dir (an empty checkpoint folder is enough): every config, parsed."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir(exist_ok=True)
    command = ["bash", "run.sh", "2", "2", "streaming", "--model", model, "--model_source", str(checkpoint)]
    command += ["--exp_dir", str(tmp_path / "exp"), "--python", sys.executable, *options]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    repo = tmp_path / "exp" / model / "model_repo_torch_streaming"
    return {
        p.parent.name: text_format.Parse(p.read_text(), model_config_pb2.ModelConfig())
        for p in repo.glob("*/config.pbtxt")
    }


def _groups(configs: dict) -> dict[str, tuple]:
    kinds = model_config_pb2.ModelInstanceGroup.Kind
    return {
        name: tuple((g.count, kinds.Name(g.kind), list(g.gpus)) for g in config.instance_group)
        for name, config in configs.items()
    }


GPU_MODELS = {
    "spark_tts": ("audio_tokenizer", "vocoder"),
    "cosyvoice2": ("audio_tokenizer", "speaker_embedding", "token2wav"),
    "cosyvoice2_dit": ("audio_tokenizer", "token2wav_dit"),
    "cosyvoice3": ("audio_tokenizer", "speaker_embedding", "token2wav", "vocoder"),
}


@pytest.mark.parametrize("model", sorted(GPU_MODELS))
def test_stage_2_spans_the_gpu_models_over_the_gpus_and_keeps_the_bls_on_the_cpu(tmp_path, model):
    options = ["--gpu_layout", "instances", "--gpus", "0,1", "--bls_instance_num", "3"]
    groups = _groups(_stage_2(tmp_path, model, *options, "--audio_tokenizer_instance_num", "2"))
    expected = {name: ((1, "KIND_GPU", [0, 1]),) for name in (*GPU_MODELS[model], "tensorrt_llm")}
    expected["audio_tokenizer"] = ((2, "KIND_GPU", [0, 1]),)  # its count, on each GPU
    expected[model] = ((3, "KIND_CPU", []),)  # the BLS
    if model != "spark_tts":
        expected["text_inbox"] = ((1, "KIND_CPU", []),)
    assert groups == expected


def test_a_streaming_token2wav_over_two_gpus_gets_the_sequence_batcher(tmp_path):
    configs = _stage_2(tmp_path, "cosyvoice2", "--gpu_layout", "instances", "--gpus", "0,1")
    assert configs["token2wav"].HasField("sequence_batching")  # 2 instances: a stream stays on one
    one_gpu = _stage_2(tmp_path, "cosyvoice2", "--gpu_layout", "instances", "--gpus", "3")
    assert not one_gpu["token2wav"].HasField("sequence_batching")
    assert _groups(one_gpu)["token2wav"] == ((1, "KIND_GPU", [0]),)  # the server sees GPU 3 as its 0


def test_cpu_devices_keep_their_models_kind_cpu_and_other_gpus_are_renumbered(tmp_path):
    options = ["--gpu_layout", "instances", "--gpus", "2,3", "--model_device", "cpu"]
    groups = _groups(_stage_2(tmp_path, "spark_tts", *options))
    assert groups["tensorrt_llm"] == ((1, "KIND_GPU", [0, 1]),)  # CUDA_VISIBLE_DEVICES=2,3: the server's 0, 1
    assert groups["audio_tokenizer"] == groups["vocoder"] == ((1, "KIND_CPU", []),)


def test_the_default_layout_writes_kind_cpu_groups_only(tmp_path):
    groups = _groups(_stage_2(tmp_path, "cosyvoice3", "--gpus", "0,1"))
    assert all(kind == "KIND_CPU" for model in groups.values() for _, kind, _ in model)


def _recording_python(tmp_path: Path) -> tuple[Path, Path]:
    """A --python that logs each call with its CUDA_VISIBLE_DEVICES, pretends the server launchers and the
    benchmark client succeeded and runs everything else with this interpreter."""
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        f'echo "CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES-unset}} $*" >> "{log}"\n'
        'case "$1" in scripts/triton_server.py|scripts/disaggregated.py|client_grpc.py) exit 0 ;; esac\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python, log


LAUNCHES = ("scripts/triton_server.py", "scripts/disaggregated.py", "client_grpc.py")


def _stages_2_4(tmp_path: Path, *options: str) -> list[str]:
    """Stages 2-4 with the recording python: the server launches and benchmark runs, in order."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    python, log = _recording_python(tmp_path)
    command = [
        "bash",
        "run.sh",
        "2",
        "4",
        "offline",
        "--python",
        str(python),
        "--exp_dir",
        str(tmp_path / "exp"),
    ]
    command += ["--model_source", str(checkpoint), "--dataset", str(checkpoint)]
    command += ["--http_port", "18555", "--grpc_port", "18556", *options]
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    calls = [line.split(" ", 1) for line in log.read_text().splitlines()]
    return [f"{env_} {call}" for env_, call in calls if call.startswith(LAUNCHES) and "status" not in call]


def test_stage_3_starts_one_server_seeing_every_gpu_and_stage_4_asks_it(tmp_path):
    start, bench = _stages_2_4(tmp_path, "--gpu_layout", "instances", "--gpus", "0,1")
    assert start.startswith("CUDA_VISIBLE_DEVICES=0,1 scripts/triton_server.py start ")
    assert "--http-port 18555 --grpc-port 18556" in start
    assert f"--model-repo {tmp_path}/exp/spark_tts/model_repo_torch_offline" in start
    assert bench.startswith(
        "CUDA_VISIBLE_DEVICES=unset client_grpc.py --server-addr localhost --server-port 18556 "
    )


def test_the_default_layouts_still_start_one_server_or_one_per_gpu(tmp_path):
    start, bench = _stages_2_4(tmp_path / "one")
    assert start.startswith("CUDA_VISIBLE_DEVICES=unset scripts/triton_server.py start ")
    assert "--server-port 18556" in bench
    start, bench = _stages_2_4(tmp_path / "dp", "--gpus", "0,1")
    assert start.startswith("CUDA_VISIBLE_DEVICES=unset scripts/disaggregated.py start --state-file ")
    assert "--co-located" in start and "--token2wav-gpus 0,1" in start
    assert "client_grpc.py --server-addrs " in bench


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--gpu_layout", "spread", "--gpus", "0,1"],
            "--gpu_layout must be servers or instances, not 'spread'",
        ),
        (["--gpu_layout", "instances"], "--gpu_layout instances needs --gpus"),
        (["--gpu_layout", "instances", "--gpus", "0,0"], "--gpu_layout instances needs --gpus, distinct"),
        (["--gpu_layout", "instances", "--gpus", "0,,1"], "--gpu_layout instances needs --gpus"),
        (
            ["--gpu_layout", "instances", "--gpus", "0,1", "--llm_backend", "trtllm"],
            "needs --llm_backend torch",
        ),
    ],
)
def test_bad_layouts_exit_2_naming_the_option(tmp_path, options, message):
    command = ["bash", "run.sh", "2", "3", *options, "--exp_dir", str(tmp_path), "--python", sys.executable]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_help_lists_the_layout_knob():
    done = subprocess.run(["bash", "run.sh", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "\n  --gpu_layout [servers] with --gpus: servers " in done.stdout
