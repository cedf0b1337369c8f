"""Warming token2wav and vocoder instances up: whole streams as a BLS calls them, no stream left open, and the
mel lengths a CosyVoice3 vocoder gets are those its token2wav gives."""

from __future__ import annotations

import torch

from tritontts.cosyvoice2.token2wav import StreamSchedule, Token2Wav, Token2WavCall
from tritontts.cosyvoice2.warmup import streamed_mel_lengths, warm_up_streams, warm_up_vocoder
from tritontts.cosyvoice3.token2mel import Token2Mel
from tritontts.cosyvoice3.wire import Token2MelCall
from tritontts.synthetic.cosyvoice2_flow import write_cosyvoice2_yaml, write_flow
from tritontts.synthetic.cosyvoice2_hift import write_hift
from tritontts.synthetic.cosyvoice3 import write_cosyvoice3_token2wav


def random_prompt(tokens: int = 20):
    gen = torch.Generator().manual_seed(3)
    return (
        torch.randint(0, 6561, (1, tokens), generator=gen, dtype=torch.int32),
        torch.randn(1, 2 * tokens, 80, generator=gen),
        torch.randn(1, 192, generator=gen),
    )


def test_warm_up_runs_planned_streams_and_closes_them(tmp_path):
    write_cosyvoice2_yaml(tmp_path, "tiny")
    write_flow(tmp_path, "tiny", seed=0)
    write_hift(tmp_path, "tiny", seed=0)
    model = Token2Wav.from_model_dir(tmp_path)
    prompt = random_prompt()
    calls = []

    def run_many(batch):
        calls.extend(batch)
        return model.run_many(batch)

    def make_call(target, chunk, stream_id):
        return Token2WavCall(target, *prompt, stream_id, chunk.token_offset, chunk.finalize)

    seconds = warm_up_streams(run_many, make_call, model.close, tokens=60, rounds=2)
    plan = StreamSchedule.from_strategy("exponential").plan(60)
    assert seconds > 0
    assert len(calls) == 2 * len(plan)
    assert [c.target_tokens.shape[1] for c in calls[: len(plan)]] == [c.token_end for c in plan]
    assert [c.finalize for c in calls].count(True) == 2
    assert model.open_streams == []


def test_vocoder_lengths_are_the_accumulated_streamed_mel(tmp_path):
    write_cosyvoice3_token2wav(tmp_path, "tiny")
    model = Token2Mel.from_model_dir(tmp_path)
    prompt = random_prompt()
    mels = []

    def run_many(batch):
        out = model.run_many(batch)
        mels.extend(out)
        return out

    def make_call(target, chunk, stream_id):
        return Token2MelCall(target, *prompt, chunk.token_offset, chunk.finalize)

    warm_up_streams(run_many, make_call, rounds=1)
    accumulated = torch.cumsum(torch.tensor([m.shape[-1] for m in mels]), 0).tolist()
    assert streamed_mel_lengths() == accumulated[:-1]
    seen = []
    warm_up_vocoder(lambda mel: seen.append(mel.shape[-1]), [30, 80], rounds=2)
    assert seen == [30, 80, 30, 80]
