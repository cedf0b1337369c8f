import time

import hift_models
import pytest
import torch
from torch import Tensor

from tritontts.cosyvoice2.hift import load_hift
from tritontts.cosyvoice2.token2wav import (
    StreamChunk,
    StreamSchedule,
    Token2Wav,
    align_prompt,
    fade_in_out,
)
from tritontts.synthetic.cosyvoice2_flow import write_flow
from tritontts.synthetic.cosyvoice2_hift import preset_config, write_hift

SAMPLES_PER_FRAME = 480
CACHE_FRAMES = 8
# HiFT's receptive field is 13 mel frames each side: a streamed call differs from one offline pass only
# within 13 frames left of its right edge j (which covers the cross-fade [j - 8, j)) and 13 frames right
# of the next call's left edge j - 8; one frame more of margin each side.
LEFT_OF_JOIN, RIGHT_OF_JOIN = 14, 6
TOLERANCE = 1e-5
NUM_TOKENS = 70


class LookaheadFlow:
    """A real token → mel map with upstream's flow contract, for the streaming mechanics.

    Two mel frames per token; a token's frames depend on itself and the next 3 tokens (the pre-lookahead),
    on the speaker embedding and on the prompt mel; without `finalize` the last 3 tokens are look-ahead
    only and get no frames. So the frames of a token never change once its look-ahead has arrived.
    """

    lookahead = 3

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.table = 0.7 * torch.randn(6561, 2 * 80, generator=gen)
        self.taps = torch.tensor([1.0, 0.5, 0.25, 0.125])

    def inference(
        self,
        token: Tensor,
        token_len: Tensor,
        prompt_token: Tensor,
        prompt_token_len: Tensor,
        prompt_feat: Tensor,
        prompt_feat_len: Tensor,
        embedding: Tensor,
        streaming: bool,
        finalize: bool,
    ) -> Tensor:
        assert int(token_len) == token.shape[1] and int(prompt_feat_len) == prompt_feat.shape[1]
        frames = self.table[token[0].long()]
        count = frames.shape[0]
        padded = torch.cat([frames, torch.zeros(self.lookahead, frames.shape[1])])
        mixed = sum(w * padded[i : i + count] for i, w in enumerate(self.taps))
        if not finalize:
            mixed = mixed[: count - self.lookahead]
        mel = mixed.reshape(-1, 80) + prompt_feat[0].mean(0) + 0.1 * embedding[0, :80] - 4.0
        return mel.T[None].contiguous()

    def inference_many(self, requests):
        return [self.inference(**request) for request in requests]


def _prompt(seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 6561, (1, 10), generator=gen, dtype=torch.int32)
    feat = 0.3 * torch.randn(1, 20, 80, generator=gen)
    embedding = torch.randn(1, 192, generator=gen)
    return tokens, feat, embedding


def _targets(count: int = NUM_TOKENS, seed: int = 2) -> Tensor:
    return torch.randint(
        0, 6561, (1, count), generator=torch.Generator().manual_seed(seed), dtype=torch.int32
    )


def _run_stream(
    t2w: Token2Wav, tokens: Tensor, schedule: StreamSchedule, stream_id: str = "s"
) -> list[Tensor]:
    prompt = _prompt()
    pieces = []
    for chunk in schedule.plan(tokens.shape[1]):
        pieces.append(
            t2w.stream(stream_id, tokens[:, : chunk.token_end], *prompt, chunk.token_offset, chunk.finalize)
        )
    return pieces


@pytest.fixture(scope="module")
def hift(tmp_path_factory):
    return load_hift(write_hift(tmp_path_factory.mktemp("hift"), "tiny", seed=0), preset_config("tiny"))


@pytest.fixture(scope="module")
def constant_source_hift():
    return hift_models.constant_source_hift()


def test_schedule_fixed_hops():
    schedule = StreamSchedule()
    assert [schedule.hop_len(k) for k in range(4)] == [15, 15, 15, 15]
    assert schedule.next_boundary(0, 0) == 18
    assert schedule.next_boundary(30, 2) == 48
    assert schedule.plan(40) == [
        StreamChunk(18, 0, False),
        StreamChunk(33, 15, False),
        StreamChunk(40, 30, True),
    ]
    assert schedule.plan(17) == [StreamChunk(17, 0, True)]


def test_schedule_exponential_hops_as_upstream_bls():
    schedule = StreamSchedule(exponential=True)
    assert [schedule.hop_len(k) for k in range(5)] == [15, 25, 50, 100, 200]
    plan = schedule.plan(300)
    assert [c.token_offset for c in plan] == [0, 15, 40, 90, 190]
    assert [c.token_end for c in plan] == [18, 43, 93, 193, 300]
    assert [c.finalize for c in plan] == [False] * 4 + [True]


def test_align_prompt_cuts_to_two_frames_per_token():
    tokens, feat = torch.arange(10)[None], torch.zeros(1, 17, 80)
    cut_tokens, cut_feat = align_prompt(tokens, feat)
    assert cut_tokens.shape == (1, 8) and cut_feat.shape == (1, 16, 80)
    cut_tokens, cut_feat = align_prompt(tokens[:, :5], feat)
    assert cut_tokens.shape == (1, 5) and cut_feat.shape == (1, 10, 80)


def test_fade_in_out_blends_the_overlap_only():
    window = torch.hamming_window(8, periodic=False, dtype=torch.float64)
    fade_in, fade_out = torch.ones(1, 10), torch.full((1, 6), 2.0)
    out = fade_in_out(fade_in, fade_out, window)
    expected = (window[:4] + 2.0 * window[4:]).float()
    torch.testing.assert_close(out[0, :4], expected)
    torch.testing.assert_close(out[0, 4:], torch.ones(6))
    assert fade_in[0, 0] == 1.0


def test_offline_length_is_two_frames_per_token(hift):
    t2w = Token2Wav(LookaheadFlow(), hift)
    audio = t2w.offline(_targets(25), *_prompt())
    assert audio.shape == (1, 25 * 2 * SAMPLES_PER_FRAME)  # 25 tokens = 1 s at 24 kHz
    assert audio.abs().max() <= 0.99
    torch.testing.assert_close(t2w.offline(_targets(25), *_prompt()), audio, rtol=0, atol=0)


@pytest.mark.parametrize("exponential", [False, True])
def test_streaming_equals_offline_outside_the_joins(constant_source_hift, exponential):
    t2w = Token2Wav(LookaheadFlow(), constant_source_hift)
    tokens = _targets()
    schedule = StreamSchedule(exponential=exponential)
    streamed = torch.cat(_run_stream(t2w, tokens, schedule), dim=1)
    offline = t2w.offline(tokens, *_prompt())
    assert streamed.shape == offline.shape == (1, NUM_TOKENS * 2 * SAMPLES_PER_FRAME)

    outside = torch.ones(NUM_TOKENS * 2, dtype=torch.bool)
    for chunk in schedule.plan(NUM_TOKENS)[:-1]:
        join = 2 * (chunk.token_end - schedule.pre_lookahead_len)  # right edge of the call, in mel frames
        outside[join - LEFT_OF_JOIN : join + RIGHT_OF_JOIN] = False
    per_frame = (streamed - offline).abs()[0].view(-1, SAMPLES_PER_FRAME).amax(dim=1)
    assert per_frame[outside].max() < TOLERANCE
    assert outside.sum() > NUM_TOKENS * 2 // 3  # the comparison covers most of the audio
    assert per_frame[~outside].max() < 0.5


def test_streaming_has_no_jump_at_the_joins(hift):
    t2w = Token2Wav(LookaheadFlow(), hift)
    pieces = _run_stream(t2w, _targets(), StreamSchedule())
    audio = torch.cat(pieces, dim=1)[0]
    jumps = (audio[1:] - audio[:-1]).abs()
    starts = torch.tensor([p.shape[1] for p in pieces]).cumsum(0)[:-1]
    inside = torch.ones_like(jumps, dtype=torch.bool)
    inside[starts - 1] = False
    assert jumps[starts - 1].max() <= jumps[inside].max()
    assert audio.shape[0] == NUM_TOKENS * 2 * SAMPLES_PER_FRAME
    assert audio.abs().max() <= 0.99


def test_streamed_piece_lengths_follow_the_schedule(hift):
    t2w = Token2Wav(LookaheadFlow(), hift)
    pieces = _run_stream(t2w, _targets(), StreamSchedule())
    frames = [p.shape[1] // SAMPLES_PER_FRAME for p in pieces]
    # 15 tokens per chunk = 30 frames, the first one less the 8 withheld frames; the tail gets the rest.
    assert frames == [22, 30, 30, 30, 140 - 22 - 90]
    assert all(p.shape[1] % SAMPLES_PER_FRAME == 0 for p in pieces)


def test_a_stream_abandoned_without_its_finalize_call_is_dropped_after_the_idle_timeout(hift):
    t2w = Token2Wav(LookaheadFlow(), hift, stream_idle_timeout_s=0.5)
    t2w.stream("abandoned", _targets()[:, :18], *_prompt(), 0, False)
    assert t2w.open_streams == ["abandoned"]
    time.sleep(1.0)
    assert t2w.open_streams == []


def test_stream_state_opens_closes_and_is_reproducible(hift):
    t2w = Token2Wav(LookaheadFlow(), hift)
    tokens, prompt = _targets(), _prompt()
    first = t2w.stream("a", tokens[:, :18], *prompt, 0, False)
    t2w.stream("b", tokens[:, :18], *prompt, 0, False)
    assert sorted(t2w.open_streams) == ["a", "b"]
    t2w.close("b")
    t2w.close("unknown")
    assert t2w.open_streams == ["a"]
    t2w.stream("a", tokens[:, :30], *prompt, 15, True)
    assert t2w.open_streams == []
    again = t2w.stream("c", tokens[:, :18], *prompt, 0, False)
    torch.testing.assert_close(again, first, rtol=0, atol=0)
    t2w.close("c")


def test_stream_rejects_a_chunk_shorter_than_the_cache(hift):
    t2w = Token2Wav(LookaheadFlow(), hift)
    with pytest.raises(ValueError, match="mel frames"):
        t2w.stream("s", _targets(6), *_prompt(), 0, False)


class RecordingFlow:
    """Delegates to a real flow and keeps every mel it returns."""

    def __init__(self, flow) -> None:
        self.flow = flow
        self.mels: list[Tensor] = []

    def inference(self, **kwargs) -> Tensor:
        mel = self.flow.inference(**kwargs)
        self.mels.append(mel)
        return mel

    def inference_many(self, requests) -> list[Tensor]:
        return [self.inference(**request) for request in requests]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cosyvoice2")
    write_flow(path, "tiny", seed=0)
    write_hift(path, "tiny", seed=0)
    return path


@pytest.fixture(scope="module")
def real_t2w(model_dir):
    return Token2Wav.from_model_dir(model_dir)


@pytest.mark.slow
def test_from_model_dir_offline(real_t2w):
    audio = real_t2w.offline(_targets(12), *_prompt())
    assert audio.shape == (1, 12 * 2 * SAMPLES_PER_FRAME)
    assert audio.abs().max() <= 0.99 and audio.std() > 1e-3
    torch.testing.assert_close(real_t2w.offline(_targets(12), *_prompt()), audio, rtol=0, atol=0)


@pytest.mark.slow
def test_real_flow_streaming(real_t2w, constant_source_hift):
    """With the real flow each call's mel depends on the chunk masks, so the stream is compared with one
    HiFT pass over the mel frames the calls contributed (exact outside the joins) and checked for jumps."""
    count = 48
    schedule = StreamSchedule()
    plan = schedule.plan(count)
    tokens = _targets(count)

    t2w = real_t2w
    pieces = _run_stream(t2w, tokens, schedule)
    assert [p.shape[1] // SAMPLES_PER_FRAME for p in pieces] == [22, 30, 30, 14]
    audio = torch.cat(pieces, dim=1)[0]
    assert audio.shape[0] == count * 2 * SAMPLES_PER_FRAME and audio.abs().max() <= 0.99
    jumps = (audio[1:] - audio[:-1]).abs()
    starts = torch.tensor([p.shape[1] for p in pieces]).cumsum(0)[:-1]
    inside = torch.ones_like(jumps, dtype=torch.bool)
    inside[starts - 1] = False
    assert jumps[starts - 1].max() <= jumps[inside].max()
    offline = t2w.offline(tokens, *_prompt())
    assert 0.5 < audio.std() / offline.std() < 2.0  # same level; the waveforms differ with the chunk masks

    recorder = RecordingFlow(t2w.flow)
    constant = Token2Wav(recorder, constant_source_hift)
    streamed = torch.cat(_run_stream(constant, tokens, schedule), dim=1)
    contributed = [
        mel[:, :, 2 * chunk.token_offset : None if chunk.finalize else 2 * (chunk.token_end - 3)]
        for chunk, mel in zip(plan, recorder.mels)
    ]
    reference, _ = constant_source_hift.inference(torch.cat(contributed, dim=2))
    outside = torch.ones(count * 2, dtype=torch.bool)
    for chunk in plan[:-1]:
        join = 2 * (chunk.token_end - schedule.pre_lookahead_len)
        outside[join - LEFT_OF_JOIN : join + RIGHT_OF_JOIN] = False
    per_frame = (streamed - reference).abs()[0].view(-1, SAMPLES_PER_FRAME).amax(dim=1)
    assert per_frame[outside].max() < TOLERANCE
