"""First chunks before LLM steps (tritontts.triton.first_chunk_priority): the shared board across processes, the
LLM engine's pause on it, and CosyVoice2, CosyVoice2-DiT and Spark-TTS (its vocoder) on the real tritonserver with
the switch on (the same audio as with it off, and the engine's held seconds counted); CosyVoice3's is in
test_cosyvoice3_triton.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cosyvoice2_dit_models import (
    TOKEN2WAV_DIT,
    build_cosyvoice2_dit_models,
    dit_bls_values,
    dit_token2wav_dir,
)
from cosyvoice2_models import (
    PREFIX,
    TEMPLATES,
    bls_values,
    build_cosyvoice2_models,
    checkpoint_paths,
    install_llm_engine,
    install_template,
    install_token2wav,
)
from cosyvoice_triton import infer, reference_request, tokens
from first_chunk_checks import held_seconds, same_audio_and_more_held_seconds
from spark_models import COMMON, build_spark_models, install, install_spark_bls
from triton_interpreter import tiny_model
from triton_stream import stream_waveforms
from waiting import wait_until

from tritontts.audio import load_wav
from tritontts.llm.engine import LLMEngine
from tritontts.llm.sequence import SamplingParams, Sequence
from tritontts.spark import tokens as spark_tokens
from tritontts.triton.first_chunk_priority import FirstChunkHolder, YieldToFirstChunks, board_path

TOKEN2WAV = PREFIX + "token2wav_priority"
LLM = PREFIX + "tensorrt_llm_priority"
BLS, PLAIN_BLS = PREFIX + "priority", PREFIX.rstrip("_")
SHARED = tuple(PREFIX + m for m in ("audio_tokenizer", "speaker_embedding", "token2wav", "tensorrt_llm"))
TOKEN2WAV_DIT_PRIORITY, DIT_BLS, PLAIN_DIT_BLS = (
    PREFIX + "token2wav_dit_priority",
    "dit_priority",
    "cosyvoice2_dit",
)


def build_priority_models(repo: Path, data: Path) -> None:
    """CosyVoice2's streaming BLS over a token2wav and an LLM engine with `first_chunk_priority` true."""
    paths = checkpoint_paths(data.parent / "build_cosyvoice2_models")
    model_dir, llm_dir = paths.model_dir.resolve(), paths.llm_dir.resolve()
    install_token2wav(TEMPLATES, repo, TOKEN2WAV, model_dir, priority=True)
    install_llm_engine(repo, LLM, llm_dir, True, 4, priority=True)
    values = bls_values(model_dir, llm_dir, True, LLM.removeprefix(PREFIX), token2wav=TOKEN2WAV)
    install_template(TEMPLATES, "cosyvoice2", repo, BLS, values)


def build_dit_priority_models(repo: Path, data: Path) -> None:
    """The CosyVoice2-DiT streaming BLS over a DiT token2wav with `first_chunk_priority` true and the LLM engine of
    build_priority_models (one repository, one board)."""
    token2wav_dir = dit_token2wav_dir(data.parent / "build_cosyvoice2_dit_models").resolve()
    llm_dir = checkpoint_paths(data.parent / "build_cosyvoice2_models").llm_dir.resolve()
    install_template(
        TEMPLATES,
        "token2wav_dit",
        repo,
        TOKEN2WAV_DIT_PRIORITY,
        f"model_dir:{token2wav_dir},{COMMON},device:cpu,dtype:float32,instance_num:1,cuda_graphs:auto,"
        "cuda_graph_batch_sizes:1,flow_compile:false,max_reference_seconds:30,first_chunk_priority:true,first_chunks_first:true",
    )
    install_template(
        TEMPLATES, "cosyvoice2_dit", repo, DIT_BLS, dit_bls_values(llm_dir, True, LLM, TOKEN2WAV_DIT_PRIORITY)
    )


SPARK_VOCODER, SPARK_LLM, SPARK_BLS = (
    "spark_vocoder_priority",
    "spark_tensorrt_llm_priority",
    "spark_priority",
)
SPARK_FIRST_CHUNK_TOKENS = 50
"""spark_models.STREAMING's first chunk: 1 s of BiCodec's 50 semantic tokens a second."""


def build_spark_priority_models(repo: Path, data: Path) -> None:
    """The Spark-TTS streaming BLS over a vocoder and an LLM engine with `first_chunk_priority` true, as run.sh
    configures them for spark_tts."""
    model_dir = (data.parent / build_spark_models.__name__ / "spark_tiny").resolve()
    install(
        "vocoder",
        repo,
        SPARK_VOCODER,
        f"model_dir:{model_dir},{COMMON},instance_num:1,device:cpu,cuda_graphs:auto,compile:auto,first_chunk_priority:true",
    )
    install(
        "tensorrt_llm_torch",
        repo,
        SPARK_LLM,
        f"model_dir:{model_dir}/LLM,{COMMON},decoupled_mode:true,llm_max_batch_size:4,llm_max_seq_len:1024,"
        "llm_dtype:float32,llm_device:cpu,llm_cuda_graphs:false,llm_compile:false,llm_decode_attention:auto,"
        f"llm_decode_linear:auto,llm_decode_pdl:auto,llm_stream_interval:auto,llm_output_tokens_from:{spark_tokens.OUTPUT_WINDOW_FROM},"
        f"first_chunk_priority:true,audio_tokens_per_s:50,first_chunk_tokens:{SPARK_FIRST_CHUNK_TOKENS}",
    )
    install_spark_bls(repo, SPARK_BLS, model_dir, True, {"tensorrt_llm": SPARK_LLM, "vocoder": SPARK_VOCODER})


TRITON_MODELS = [
    build_cosyvoice2_models,
    build_priority_models,
    build_cosyvoice2_dit_models,
    build_dit_priority_models,
    build_spark_models,
    build_spark_priority_models,
]
UNLOAD_AFTER = (BLS, LLM, TOKEN2WAV, DIT_BLS, TOKEN2WAV_DIT_PRIORITY, SPARK_BLS, SPARK_LLM, SPARK_VOCODER)


def run_holder(board: Path, hold: bool) -> subprocess.Popen:
    """A process that takes a slot on `board` (holding it for 30 s when `hold`), prints its slot and the monotonic
    time (one clock for every process of the host) right after the hold began, then sleeps."""
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tritontts.triton.first_chunk_priority import FirstChunkHolder
        holder = FirstChunkHolder(Path({str(board)!r}), max_hold_s=30.0)
        if {hold}:
            holder.hold()
        print(holder.slot, time.monotonic(), flush=True)
        time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    slot, held_at = process.stdout.readline().split()
    process.slot, process.held_at = int(slot), float(held_at)
    return process


def running(tokens_out: int, first_token_at: float | None) -> Sequence:
    seq = Sequence(0, [1], SamplingParams(), 0, 100)
    seq.output_ids = list(range(tokens_out))
    seq.first_token_at = first_token_at
    return seq


def test_a_hold_in_another_process_pauses_while_every_stream_has_audio_in_hand(tmp_path):
    board = tmp_path / "board"
    holder = run_holder(board, hold=True)
    now = [holder.held_at]  # not this process's time after the holder started: on a busy host that is later
    check = YieldToFirstChunks(board, audio_tokens_per_s=25.0, first_chunk_tokens=18, clock=lambda: now[0])
    try:
        ahead = running(1000, now[0] - 1.0)  # 40 s of audio 1 s after its first token: 39 s in hand
        assert 20.0 < check([ahead]) <= 30.0
        assert check([ahead, running(0, None)]) == 0.0  # a stream still before its first token
        assert check([ahead, running(50, now[0] - 1.0)]) == 0.0  # 1 s in hand, less than the hold's 30
        now[0] += 29.5
        assert 0.49 < check([running(100, now[0])]) <= 0.5  # 4 s in hand, 0.5 s of the hold left
        assert 0.49 < check([running(18, now[0])]) <= 0.5  # 0.72 s in hand and its first chunk's tokens
        assert check([running(17, now[0])]) == 0.0  # 0.68 s in hand, but one token short of its first chunk
        assert check([]) == 0.0
    finally:
        holder.kill()
        holder.wait()
        check.close()


def test_a_dead_holders_hold_runs_out_and_its_slot_is_taken_again(tmp_path):
    board = tmp_path / "board"
    ours = FirstChunkHolder(board, max_hold_s=0.2)
    dead = run_holder(board, hold=True)
    dead.send_signal(signal.SIGKILL)
    dead.wait()
    check = YieldToFirstChunks(board, audio_tokens_per_s=1.0)
    stream = running(1000, time.monotonic())
    assert check([stream]) > 1.0  # the dead holder's 30 s
    again = run_holder(board, hold=False)
    try:
        assert again.slot == dead.slot != ours.slot
        assert check([stream]) == 0.0
        ours.hold()
        assert 0.0 < check([stream]) <= 0.2
        ours.release()
        assert check([stream]) == 0.0
    finally:
        again.kill()
        again.wait()
        ours.close()
        check.close()
    assert not board.exists()  # the last live holder removed it


def test_a_board_that_appears_later_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("tritontts.triton.first_chunk_priority.REOPEN_EVERY_S", 0.0)
    board = tmp_path / "board"
    check = YieldToFirstChunks(board, audio_tokens_per_s=1.0)
    stream = running(1000, time.monotonic())
    assert check([stream]) == 0.0
    holder = FirstChunkHolder(board, max_hold_s=5.0)
    holder.hold()
    assert check([stream]) > 4.0
    holder.close()
    check.close()


def test_boards_are_per_repository_and_device(tmp_path):
    a, b = tmp_path / "a" / "token2wav", tmp_path / "b" / "tensorrt_llm"
    cpu = torch.device("cpu")
    assert board_path(a, cpu) == board_path(a.parent / "tensorrt_llm", cpu)
    assert board_path(a, cpu) != board_path(b, cpu)
    assert board_path(a, torch.device("cuda", 0)) != board_path(a, torch.device("cuda", 1))


def test_the_engine_holds_steps_on_a_hold_and_never_a_new_requests_first_token(tmp_path, tiny_engine_model):
    holder = FirstChunkHolder(tmp_path / "board", max_hold_s=2.0)
    check = YieldToFirstChunks(
        holder.path, audio_tokens_per_s=1.0
    )  # 5 tokens: 5 s in hand, more than the hold
    engine = LLMEngine.from_model(tiny_engine_model, max_batch_size=2, max_seq_len=256, cuda_graphs=False)
    engine.pause_check = check
    streamed: dict[int, list[int]] = {0: [], 1: []}
    params = SamplingParams(max_tokens=200, temperature=0.0)
    engine.start()
    try:
        engine.add_request([1, 2, 3], params, lambda e: streamed[0].extend(e.token_ids), request_id=0)
        wait_until(lambda: len(streamed[0]), lambda n: n >= 5, "five tokens")
        holder.hold()
        held_at = len(wait_until(lambda: list(streamed[0]), lambda t: True, "a reading"))
        time.sleep(0.3)
        assert len(streamed[0]) <= held_at + 2  # at most the step in flight when the hold began
        engine.add_request([4, 5], params, lambda e: streamed[1].extend(e.token_ids), request_id=1)
        wait_until(
            lambda: len(streamed[1]), lambda n: n >= 1, "the new request's first token during the hold"
        )
        holder.release()
        wait_until(lambda: len(streamed[0]), lambda n: n >= held_at + 20, "steps again after the release")
        assert engine.paused_s >= 0.25
    finally:
        engine.stop()
        holder.close()
        check.close()


def test_a_stream_short_of_audio_keeps_the_engine_stepping(tmp_path, tiny_engine_model):
    holder = FirstChunkHolder(tmp_path / "board", max_hold_s=30.0)
    engine = LLMEngine.from_model(tiny_engine_model, max_batch_size=2, max_seq_len=256, cuda_graphs=False)
    engine.pause_check = YieldToFirstChunks(holder.path, audio_tokens_per_s=1e6)  # no audio in hand, ever
    streamed: list[int] = []
    engine.start()
    try:
        holder.hold()
        engine.add_request(
            [1, 2, 3], SamplingParams(max_tokens=100, temperature=0.0), lambda e: streamed.extend(e.token_ids)
        )
        wait_until(lambda: len(streamed), lambda n: n == 100, "all 100 tokens under the hold")
        assert engine.paused_s == 0.0
    finally:
        engine.stop()
        holder.close()
        engine.pause_check.close()


def test_holds_change_no_token_and_a_stream_ending_in_flight_finishes_before_the_hold(
    tmp_path, tiny_engine_model
):
    prompts = [[1, 2, 3], [7, 8, 9, 10], [4]]
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in (40, 9, 60)]
    plain = LLMEngine.from_model(tiny_engine_model, max_batch_size=4, max_seq_len=256, cuda_graphs=False)
    expected = plain.generate(prompts, params)

    holder = FirstChunkHolder(tmp_path / "board", max_hold_s=2.0)
    engine = LLMEngine.from_model(tiny_engine_model, max_batch_size=4, max_seq_len=256, cuda_graphs=False)
    engine.pause_check = YieldToFirstChunks(holder.path, audio_tokens_per_s=1.0)  # 5 tokens: 5 s in hand
    events: dict[int, list] = {i: [] for i in range(3)}
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(prompt, p, events[i].append, request_id=i)
    while len(events[1]) < 5:  # by hand, on this thread: the short stream is 5 tokens in
        engine.step()
    assert engine._inflight is not None
    holder.hold()
    assert engine._hold_s() > 0
    delivered = sum(len(e) for e in events.values())
    engine._deliver_inflight()  # what the serving thread does first when a hold begins
    assert sum(len(e) for e in events.values()) == delivered + 3 and engine._inflight is None
    holder.release()
    while engine.has_work():
        engine.step()
    for i in range(3):
        assert [t for e in events[i] for t in e.token_ids] == expected[i]
        assert events[i][-1].finished
    holder.close()
    engine.pause_check.close()


def test_a_stream_that_ends_in_the_step_in_flight_gets_its_last_event_during_the_hold(
    tmp_path, tiny_engine_model
):
    holder = FirstChunkHolder(tmp_path / "board", max_hold_s=30.0)
    engine = LLMEngine.from_model(tiny_engine_model, max_batch_size=2, max_seq_len=256, cuda_graphs=False)
    # 10 s of audio a token: the hold starts to count at the third token, with the fourth and last in flight
    engine.pause_check = YieldToFirstChunks(holder.path, audio_tokens_per_s=0.1)
    events: list = []
    holder.hold()
    engine.start()
    try:
        engine.add_request([1, 2, 3], SamplingParams(max_tokens=4, temperature=0.0), events.append)
        wait_until(
            lambda: list(events), lambda e: e and e[-1].finished, "the last event well within the hold"
        )
        assert sum(len(e.token_ids) for e in events) == 4 and engine.paused_s == 0.0
    finally:
        engine.stop()
        holder.close()
        engine.pause_check.close()


@pytest.fixture(scope="module")
def tiny_engine_model():
    return tiny_model()


@pytest.fixture(scope="module")
def server(triton):
    return triton.load(*SHARED, PLAIN_BLS, TOKEN2WAV, LLM, BLS)


def test_cosyvoice2_with_first_chunk_priority_gives_the_same_audio_and_holds_the_llm(server, prompt_zh):
    wav = load_wav(prompt_zh, 16000)[: 16000 * 3]
    values = reference_request(wav, "身临其境，换新体验。", "吃燕窝就选燕之屋")
    board = board_path(server.repo / TOKEN2WAV, torch.device("cpu"))
    assert board.exists()
    same_audio_and_more_held_seconds(server, PLAIN_BLS, BLS, LLM, values)
    assert held_seconds(server, PREFIX + "tensorrt_llm") == 0.0


def test_the_dit_token2wavs_first_chunks_hold_the_llm_and_leave_the_audio_alone(server, triton, prompt_zh):
    triton.load(PREFIX + "audio_tokenizer", PREFIX + "tensorrt_llm", TOKEN2WAV_DIT, PLAIN_DIT_BLS)
    triton.load(TOKEN2WAV_DIT_PRIORITY, DIT_BLS)
    values = reference_request(
        load_wav(prompt_zh, 16000)[: 16000 * 3], "身临其境，换新体验。", "吃燕窝就选燕之屋"
    )
    same_audio_and_more_held_seconds(server, PLAIN_DIT_BLS, DIT_BLS, LLM, values)


def test_spark_ttss_vocoder_holds_the_llm_for_first_chunks_and_leaves_the_audio_alone(triton, prompt_zh):
    """The vocoder gives a flagged first chunk the audio the plain vocoder gives it; streams of the BLS over the
    priority vocoder and LLM are as long as the plain BLS's (the tokens are sampled, so not the same samples:
    the engine test above shows a hold changes no token), and the LLM counts held seconds."""
    server = triton.load("audio_tokenizer", "vocoder", "tensorrt_llm", "spark_tts")
    server = triton.load(SPARK_VOCODER, SPARK_LLM, SPARK_BLS)
    assert board_path(server.repo / SPARK_VOCODER, torch.device("cpu")).exists()
    rng = np.random.default_rng(0)
    chunk = {
        "global_tokens": rng.integers(0, 4096, (1, 32)).astype(np.int32),
        "semantic_tokens": rng.integers(0, 8192, (1, SPARK_FIRST_CHUNK_TOKENS)).astype(np.int32),
    }
    flagged = infer(server, SPARK_VOCODER, chunk | {"first_chunk": np.ones((1, 1), dtype=bool)})
    np.testing.assert_allclose(flagged, infer(server, "vocoder", chunk), atol=1e-6)

    values = reference_request(
        load_wav(prompt_zh, 16000)[: 16000 * 3], "身临其境，换新体验。", "吃燕窝就选燕之屋"
    )
    held_before = held_seconds(server, SPARK_LLM)
    plain = stream_waveforms(server.grpc_url, "spark_tts", values, tokens(100))
    for _ in range(3):
        held = stream_waveforms(server.grpc_url, SPARK_BLS, values, tokens(100))
        assert [c.size for c in held] == [c.size for c in plain]
    wait_until(
        lambda: held_seconds(server, SPARK_LLM),
        lambda seconds: seconds > held_before,
        f"{SPARK_LLM}'s held seconds above {held_before} after three streams of {SPARK_BLS}",
        timeout=10,
    )
    assert held_seconds(server, "tensorrt_llm") == 0.0
