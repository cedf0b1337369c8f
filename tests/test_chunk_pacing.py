"""Later chunks make way for first chunks (tritontts.triton.chunk_pacing): the pacer on a board shared across
processes, and the CosyVoice service asking it before each token2wav call."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from cosyvoice2_models import tiny_prompter

from tritontts.cosyvoice2.prompt import Decoding
from tritontts.cosyvoice2.service import CosyVoice2Request, CosyVoice2Service, Voice
from tritontts.triton.chunk_pacing import ChunkPacer, chunk_pacer, pacing_board_path
from tritontts.triton.first_chunk_board import FirstChunkHolder, map_board


def hold_in_another_process(board: Path, seconds: float) -> subprocess.Popen:
    """A process holding a slot of `board` for `seconds` from when it prints its slot."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from tritontts.triton.first_chunk_board import FirstChunkHolder
        holder = FirstChunkHolder(Path({str(board)!r}), max_hold_s={seconds})
        holder.hold()
        print(holder.slot, flush=True)
        time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    process.slot = int(process.stdout.readline())
    return process


@pytest.fixture
def board(tmp_path):
    return tmp_path / "board"


def fake_time_pacer(board: Path, margin_s: float) -> tuple[ChunkPacer, list[float]]:
    """A pacer whose sleeps advance its own clock (the other process's hold stays in the future)."""
    now = [time.monotonic()]
    pacer = ChunkPacer(FirstChunkHolder(board), margin_s, clock=lambda: now[0])
    pacer.sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)
    return pacer, now


def test_a_later_chunk_waits_while_another_first_chunk_is_pending_until_its_margin(board):
    other = hold_in_another_process(board, seconds=30.0)
    pacer, _ = fake_time_pacer(board, margin_s=0.5)
    try:
        assert other.slot != pacer.holder.slot
        assert pacer.wait_turn(2.0) == pytest.approx(1.5, abs=0.01)  # until 0.5 s of audio is left
        assert pacer.wait_turn(0.4) == 0.0  # less than the margin in hand: no wait
        assert pacer.wait_turn(-1.0) == 0.0  # already late
    finally:
        other.kill()
        other.wait()
        pacer.close()


def test_nothing_pending_means_no_wait_and_an_expired_hold_ends_one(board):
    pacer = ChunkPacer(FirstChunkHolder(board), margin_s=0.0)
    try:
        assert pacer.wait_turn(10.0) < 0.01
        other = hold_in_another_process(board, seconds=2.0)
        try:
            waited = pacer.wait_turn(30.0)  # the real clock: the other hold runs out after 2 s
        finally:
            other.kill()
            other.wait()
        assert 0.5 < waited < 10.0
    finally:
        pacer.close()


def test_a_first_chunk_marks_its_slot_only_while_it_is_asked_for(board):
    pacer = ChunkPacer(FirstChunkHolder(board), margin_s=0.5)
    memory, entries = map_board(board, create=False)
    try:
        with pacer.first_chunk():
            assert entries["until"][pacer.holder.slot] > time.monotonic()
        assert entries["until"][pacer.holder.slot] == 0.0
        with pytest.raises(RuntimeError), pacer.first_chunk():
            raise RuntimeError("token2wav failed")
        assert entries["until"][pacer.holder.slot] == 0.0
    finally:
        del entries
        memory.close()
        pacer.close()


def test_the_bls_parameters_make_a_pacer(tmp_path):
    args = {"model_repository": str(tmp_path / "repo" / "cosyvoice2")}
    assert chunk_pacer({"parameters": {}}, args) is None
    params = {"chunk_pacing": {"string_value": "true"}, "chunk_pacing_margin_s": {"string_value": "0.25"}}
    pacer = chunk_pacer({"parameters": params}, args)
    try:
        assert pacer.margin_s == 0.25 and pacer.holder.path == pacing_board_path(args["model_repository"])
    finally:
        pacer.close()
    params["chunk_pacing_margin_s"] = {"string_value": "-1"}
    with pytest.raises(ValueError, match="chunk_pacing_margin_s must be at least 0"):
        chunk_pacer({"parameters": params}, args)


class RecordingPacer:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    @contextmanager
    def first_chunk(self):
        self.events.append(("first", "start"))
        yield
        self.events.append(("first", "end"))

    def wait_turn(self, audio_in_hand_s: float) -> float:
        self.events.append(("wait", audio_in_hand_s))
        return 0.0


def test_the_service_marks_its_first_chunk_and_waits_its_turn_before_each_later_one(tmp_path):
    prompter = tiny_prompter(tmp_path / "llm")
    pacer, calls = RecordingPacer(), []

    def generate(prompt_ids, sampling, streaming):
        for _ in range(12):
            yield np.arange(10, dtype=np.int32) + prompter.ids.speech_base

    def token2wav(tokens, voice, offset, finalize, request_id):
        calls.append(offset)
        pacer.events.append(("token2wav", offset))
        return np.zeros(960, dtype=np.float32)

    service = CosyVoice2Service(
        prompter,
        tokenize=None,
        embed=None,
        generate=generate,
        token2wav=token2wav,
        default_voice=Voice("cached text ", np.array([3, 1], dtype=np.int32)),
        sampling=prompter.sampling_params(Decoding(max_tokens=200)),
        pacer=pacer,
    )
    list(service.stream(CosyVoice2Request(None, "", "hello"), "r1"))
    assert pacer.events[:3] == [("first", "start"), ("token2wav", 0), ("first", "end")]
    later = pacer.events[3:]
    assert len(calls) >= 3 and len(later) == 2 * (len(calls) - 1)
    for (kind, in_hand), (call, offset) in zip(later[::2], later[1::2]):
        assert kind == "wait" and call == "token2wav"
        # the audio sent before this call: `offset` tokens at 25 a second, less the moments since the first chunk
        assert offset / 25 - 1.0 < in_hand <= offset / 25
