"""Client pieces CosyVoice2 needs, without a server: rates by model, the cached-speaker request, its flags."""

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tritontts.bench import triton_io

REPO = Path(__file__).resolve().parents[1]


def load_client(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rates_and_overlaps_by_model_name():
    assert triton_io.output_sample_rate("cosyvoice2") == 24000
    assert triton_io.output_sample_rate("spark_tts_bls") == 16000
    assert triton_io.token_rate("cosyvoice2") == 25 and triton_io.token_rate("cosyvoice2_x") == 25
    assert triton_io.token_rate("spark_tts") == 50 and triton_io.token_rate("other") == 50
    assert triton_io.chunk_overlap_seconds("cosyvoice2") == 0.0
    assert triton_io.chunk_overlap_seconds("spark_tts") == pytest.approx(0.1)
    assert triton_io.chunk_overlap_seconds("cosyvoice2", 0.05) == pytest.approx(0.05)


def test_cached_speaker_request_sends_target_text_only():
    import tritonclient.grpc as grpcclient

    arrays = triton_io.target_only_arrays("你好。")
    assert list(arrays) == ["target_text"] and arrays["target_text"].shape == (1, 1)
    (tensor,) = triton_io.infer_inputs(grpcclient, arrays)
    assert (tensor.name(), tensor.datatype(), tensor.shape()) == ("target_text", "BYTES", [1, 1])


@pytest.mark.parametrize("text, value", [("True", True), ("false", False), ("TRUE", True)])
def test_true_or_false_takes_upstream_spellings(text, value):
    assert triton_io.true_or_false(text) is value


def test_true_or_false_refuses_anything_else():
    with pytest.raises(argparse.ArgumentTypeError):
        triton_io.true_or_false("yes")


def test_grpc_client_single_utterance_from_the_cached_speaker():
    client = load_client("client_grpc")
    args = client.get_parser().parse_args(
        ["--model-name", "cosyvoice2", "--use-spk2info-cache", "True", "--target-text", "你好。"]
    )
    assert client.single_utterance(args) and args.chunk_overlap_duration is None
    (item,) = client.load_items(args)
    assert (item.id, item.target_text, item.prompt_audio.size) == ("test", "你好。", 0)
    dataset_args = client.get_parser().parse_args(["--use-spk2info-cache", "true"])
    assert not client.single_utterance(dataset_args)


def test_http_client_cached_speaker_does_not_read_the_reference(tmp_path):
    client = load_client("client_http")
    missing = str(tmp_path / "absent.wav")
    args = client.get_parser().parse_args(
        ["--use-spk2info-cache", "true", "--reference-audio", missing, "--target-text", "你好。"]
    )
    assert list(client.request_arrays(args)) == ["target_text"]
    args.use_spk2info_cache = False
    with pytest.raises(FileNotFoundError, match="absent.wav"):
        client.request_arrays(args)


def test_realistic_lengths_ask_25_tokens_per_second_of_cosyvoice2():
    client = load_client("client_grpc")
    args = client.get_parser().parse_args(["--model-name", "cosyvoice2", "--realistic-lengths"])
    requester = client.Requester.__new__(client.Requester)
    requester.args, requester.token_rate = args, triton_io.token_rate(args.model_name)
    utt = client.Utterance("u", "", np.zeros(0, dtype=np.float32), 16000, "你好世界。")
    assert requester._parameters(utt) == {"min_new_tokens": 24, "max_new_tokens": 24}  # 4 / 4.2 s * 25
