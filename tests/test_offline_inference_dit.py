"""offline_inference.py --model cosyvoice2_dit (the tiny CosyVoice2 LLM, the tiny synthetic Step-Audio-2-mini DiT
token2wav, CPU) over the first row of the small bench dataset (its other rows add minutes of CPU), and the
openai backend against a real `python -m tritontts.llm.openai_server`.

With --realistic-lengths every row makes exactly its forced count of speech tokens, so 960 samples each at 24 kHz.
At batch size 1 the in-process engine and the server run the same prompts one at a time with the same engine
settings and the same per-request seeds, so they sample the same tokens and token2wav writes the same samples.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile
from http_service import http_service

from tritontts.bench.dataset import Utterance, load_utterances, write_manifest
from tritontts.bench.durations import expected_tokens
from tritontts.bench.offline_cosyvoice2_dit import DiTToken2WavStrategy
from tritontts.bench.offline_cosyvoice2_prompt import SpeechPrompt, decoding_of
from tritontts.bench.offline_openai import ChatSpeechBackend, chat_completions_url, speech_ids
from tritontts.bench.offline_settings import LLMEndpointError
from tritontts.cosyvoice2.frontend import SPEECH_TOKENIZER_FILE, SpeechTokenizer
from tritontts.cosyvoice2.layout import LLM_DIR, MODEL_DIR
from tritontts.cosyvoice2.prompt import CosyVoice2Prompt
from tritontts.dit_token2wav.layout import TOKEN2WAV_DIR
from tritontts.dit_token2wav.token2wav import DiTToken2Wav
from tritontts.triton.server import free_ports

REPO = Path(__file__).resolve().parents[1]
SAMPLES_PER_TOKEN = 2 * 480
MAX_SEQ_LEN = "512"
ROWS = "1"


@pytest.fixture(scope="module")
def dit_root(tmp_path_factory) -> Path:
    from tritontts.synthetic.cosyvoice2 import write_cosyvoice2_checkpoint
    from tritontts.synthetic.dit_token2wav import write_dit_token2wav

    root = write_cosyvoice2_checkpoint(tmp_path_factory.mktemp("cosyvoice2_dit_tiny"), "tiny", 0).root
    write_dit_token2wav(root / TOKEN2WAV_DIR, "tiny", 0)
    return root


def _main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("offline_inference", REPO / "offline_inference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def _run(root: Path, data: Path, log_dir: Path, *extra: str, model: str = "cosyvoice2_dit") -> int:
    common = ["--model", model, "--model-dir", str(root), "--huggingface-dataset", str(data)]
    return _main([*common, "--device", "cpu", "--log-dir", str(log_dir), "--limit-rows", ROWS, *extra])


def _report(log_dir: Path, backend: str) -> dict:
    return json.loads((log_dir / f"offline_cosyvoice2_dit_{backend}.json").read_text())


REALISTIC = ("--batch-sizes", "1", "--realistic-lengths", "--max-seq-len", MAX_SEQ_LEN)


@pytest.fixture(scope="module")
def torch_run(dit_root, bench_data, tmp_path_factory) -> tuple[Path, dict]:
    log_dir = tmp_path_factory.mktemp("dit_torch")
    assert _run(dit_root, bench_data, log_dir, *REALISTIC) == 0
    return log_dir, _report(log_dir, "torch")


@pytest.fixture(scope="module")
def llm_server(dit_root, tmp_path_factory):
    log_file = tmp_path_factory.mktemp("dit_llm_server") / "server.log"
    args = [
        *("--model-dir", str(dit_root / LLM_DIR), "--device", "cpu", "--max-batch-size", "1"),
        *("--max-seq-len", MAX_SEQ_LEN, "--no-cuda-graphs", "--log-level", "warning"),
    ]
    with http_service("tritontts.llm.openai_server", args, log_file, timeout_s=120) as url:
        yield url


def _wavs(log_dir: Path, backend: str, result: dict) -> dict[str, np.ndarray]:
    wavs = {}
    for record in result["records"]:
        wav, rate = soundfile.read(log_dir / f"{backend}_bs{result['batch_size']}" / f"{record['id']}.wav")
        assert rate == 24000
        wavs[record["id"]] = wav
    return wavs


def _assert_forced_lengths(log_dir: Path, backend: str, result: dict) -> None:
    assert result["rows"] == int(ROWS) == len(result["records"])
    wavs = _wavs(log_dir, backend, result)
    for record in result["records"]:
        assert record["forced_tokens"] > 0
        assert record["tokens"] == record["speech_tokens"] == record["forced_tokens"]
        assert len(wavs[record["id"]]) == SAMPLES_PER_TOKEN * record["forced_tokens"]
        assert record["audio_s"] == pytest.approx(len(wavs[record["id"]]) / 24000)


def test_torch_backend_writes_25_tokens_per_second_of_24k_audio(torch_run, bench_data):
    log_dir, report = torch_run
    assert (report["model"], report["backend"], report["stages"]) == (
        "cosyvoice2_dit",
        "torch",
        ["frontend", "llm", "token2wav"],
    )
    assert (report["token2wav_dtype"], report["hift_dtype"], report["dtype"]) == ("float32",) * 3
    assert report["settings"]["token_rate"] == 25 and report["settings"]["max_seq_len"] == int(MAX_SEQ_LEN)
    (result,) = report["results"]
    assert (result["batch_size"], result["batches"]) == (1, int(ROWS))
    _assert_forced_lengths(log_dir, "torch", result)
    rows = load_utterances(str(bench_data), "wenetspeech4tts")[: int(ROWS)]
    assert [r["id"] for r in result["records"]] == [u.id for u in rows]
    assert [r["forced_tokens"] for r in result["records"]] == [
        expected_tokens(u.target_text, 25) for u in rows
    ]
    stages = result["frontend_s"] + result["llm_s"] + result["token2wav_s"]
    assert 0 < stages <= result["wall_s"]
    assert result["rtf"] == pytest.approx(result["wall_s"] / result["audio_s"])
    assert result["warmup"]["rows"] == 1 and result["warmup"]["speech_tokens"] > 0
    table = (log_dir / "offline_cosyvoice2_dit_torch.md").read_text().splitlines()
    assert "| Token2wav s |" in table[0] and table[2].startswith(f"| torch | 1 | {ROWS} |")


def test_openai_backend_gives_the_torch_backends_audio(dit_root, bench_data, torch_run, llm_server, tmp_path):
    alias = ("--backend", "trtllm-serve", "--llm-endpoint", llm_server)
    assert _run(dit_root, bench_data, tmp_path, *alias, *REALISTIC) == 0
    report = _report(tmp_path, "openai")
    assert report["backend"] == "openai" and report["dtype"] is None
    assert report["llm_endpoint"] == f"{llm_server}/v1/chat/completions"
    assert report["settings"]["max_seq_len"] is None
    (result,) = report["results"]
    _assert_forced_lengths(tmp_path, "openai", result)
    torch_dir, torch_report = torch_run
    (torch_result,) = torch_report["results"]
    ours, theirs = _wavs(tmp_path, "openai", result), _wavs(torch_dir, "torch", torch_result)
    assert ours.keys() == theirs.keys()
    for row_id, wav in ours.items():
        np.testing.assert_array_equal(wav, theirs[row_id], err_msg=row_id)


def test_an_endpoint_error_names_the_url_and_status(dit_root, llm_server):
    prompter = CosyVoice2Prompt.from_llm_dir(dit_root / LLM_DIR)
    backend = ChatSpeechBackend(
        f"{llm_server}/v1/no-such-path", "llm", decoding_of(prompter), 4, 0, prompter.ids.speech_base, 1
    )
    backend.check_reachable()
    tokens = np.array([1, 2, 3], dtype=np.int32)
    prompt = SpeechPrompt("参考", "你好", tokens, np.asarray(prompter.input_ids("参考", "你好", tokens)))
    with pytest.raises(LLMEndpointError, match=f"{llm_server}/v1/no-such-path answered HTTP 404"):
        backend([prompt], [None])
    backend.close()


def test_openai_without_endpoint_or_server_fails_clearly(dit_root, bench_data, tmp_path, capsys):
    assert _run(dit_root, bench_data, tmp_path, "--backend", "openai") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--llm-endpoint" in err
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    assert _run(dit_root, bench_data, tmp_path, "--backend", "openai", "--llm-endpoint", url) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"cannot reach the LLM endpoint {url}" in err
    assert not list(tmp_path.glob("*.json"))


def test_openai_backend_is_for_cosyvoice2_models_only(bench_data, tmp_path, capsys):
    argv = [
        "--model-dir",
        str(tmp_path),
        "--huggingface-dataset",
        str(bench_data),
        "--log-dir",
        str(tmp_path),
    ]
    assert _main([*argv, "--backend", "openai", "--llm-endpoint", "http://127.0.0.1:9"]) == 1
    assert "--model spark_tts takes torch, hf or trtllm" in capsys.readouterr().err


@pytest.fixture(scope="module")
def short_row(tmp_path_factory) -> Path:
    """One row with a 2 s reference (the bench rows' is 10 s), which keeps the DiT prompt short."""
    from tritontts.synthetic.cosyvoice2 import voiced_signal

    # a transcript about as long as the clip: the synthetic LLM speaks the text's share of the context
    row = Utterance(
        "short", "这是一段两秒钟的参考文本。", voiced_signal(seconds=2.0, seed=3), 16000, "你好。"
    )
    return write_manifest([row], tmp_path_factory.mktemp("short_row"))


def test_hf_backend_one_row(dit_root, short_row, tmp_path):
    pytest.importorskip("transformers")
    rc = _run(dit_root, short_row, tmp_path, "--backend", "hf", "--batch-sizes", "1", "--max-new-tokens", "4")
    assert rc == 0
    (result,) = _report(tmp_path, "hf")["results"]
    (record,) = result["records"]
    assert 0 < record["speech_tokens"] <= 4
    wav, rate = soundfile.read(record["wav"])
    assert rate == 24000 and len(wav) == SAMPLES_PER_TOKEN * record["speech_tokens"]


def test_model_dir_must_hold_the_token2wav_folder(bench_data, tmp_path, capsys):
    assert _run(tmp_path, bench_data, tmp_path) == 1
    err = capsys.readouterr().err
    assert "CosyVoice2-0.5B" in err and "cosyvoice2_llm" in err and TOKEN2WAV_DIR in err


def test_chat_url_and_reply_parsing():
    chat = "http://h:8000/v1/chat/completions"
    assert [
        chat_completions_url(u) for u in ("http://h:8000", "http://h:8000/", "http://h:8000/v1/", chat)
    ] == [chat] * 4
    with pytest.raises(ValueError, match="--llm-endpoint"):
        chat_completions_url("localhost:8000")
    assert speech_ids("<|s_0|><|s_6560|>x<|s_12|>", 151663) == [151663, 151663 + 6560, 151663 + 12]


def test_cosyvoice2_flow_model_over_openai(dit_root, short_row, llm_server, tmp_path):
    extra = ("--backend", "openai", "--llm-endpoint", llm_server, "--batch-sizes", "1", "--realistic-lengths")
    assert _run(dit_root, short_row, tmp_path, *extra, model="cosyvoice2") == 0
    report = json.loads((tmp_path / "offline_cosyvoice2_openai.json").read_text())
    (record,) = report["results"][0]["records"]
    assert record["speech_tokens"] == record["forced_tokens"] == expected_tokens("你好。", 25)
    wav, rate = soundfile.read(record["wav"])
    assert rate == 24000 and len(wav) == SAMPLES_PER_TOKEN * record["speech_tokens"]


def test_dit_voices_are_kept_per_reference_until_forgotten(dit_root):
    from tritontts.synthetic.cosyvoice2 import voiced_signal

    tokenizer = SpeechTokenizer(dit_root / MODEL_DIR / SPEECH_TOKENIZER_FILE)
    strategy = DiTToken2WavStrategy(
        tokenizer, DiTToken2Wav.from_model_dir(dit_root / TOKEN2WAV_DIR, "cpu", speaker_cache_size=0)
    )
    wav = voiced_signal(seconds=2.0, seed=4)
    voice = strategy.voice(wav)
    np.testing.assert_array_equal(voice.speech_tokens, tokenizer(wav))
    assert voice.speaker.prompt_tokens.shape[1] <= len(voice.speech_tokens)
    assert strategy.voice(wav.copy()) is voice
    strategy.forget_voices()
    assert strategy.voice(wav) is not voice
