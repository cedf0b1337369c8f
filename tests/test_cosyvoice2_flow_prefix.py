"""The flow decoder over the frames after a prefix of whole chunks (tritontts.cosyvoice2.flow.prefix) gives the
mel the decoder gives over all the frames, on the tiny synthetic checkpoint in fp32."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tritontts.cosyvoice2.flow import Flow, load_flow
from tritontts.synthetic.cosyvoice2_flow import write_flow

VOCAB = 6561
CHUNK = 50  # the estimator's static_chunk_size (mel frames)


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    directory: Path = tmp_path_factory.mktemp("cosyvoice2_tiny_prefix")
    write_flow(directory, "tiny", seed=0)
    return load_flow(directory)


def _conditions(flow: Flow, prompt_tokens: int, target_tokens: int, target_seed: int = 6):
    """A prompt drawn with seed 5 (tokens, mel, speaker) before target tokens drawn with `target_seed`."""
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, VOCAB, (1, prompt_tokens), generator=gen, dtype=torch.int32)
    feat = torch.randn(1, 2 * prompt_tokens, 80, generator=gen)
    embedding = torch.randn(1, 192, generator=gen)
    target = torch.Generator().manual_seed(target_seed)
    tokens = torch.randint(0, VOCAB, (1, target_tokens), generator=target, dtype=torch.int32)
    return flow.conditions(
        tokens,
        torch.tensor([target_tokens], dtype=torch.int32),
        prompt,
        torch.tensor([prompt_tokens], dtype=torch.int32),
        feat,
        embedding,
        streaming=True,
        finalize=True,
    )


def _full(flow: Flow, c, steps: int) -> torch.Tensor:
    return flow.decoder(c.mu, torch.ones_like(c.mu[:, :1]), c.spks, c.cond, steps, streaming=True)


@torch.inference_mode()
def test_the_frames_after_a_prompt_prefix_match_the_whole_call(flow: Flow) -> None:
    steps = flow.config.cfm.n_timesteps
    c = _conditions(flow, prompt_tokens=60, target_tokens=28)  # 120 prompt frames: 2 whole chunks
    full = _full(flow, c, steps)
    start = 2 * CHUNK
    _, prefixes = flow.decoder.solve_after(
        None, c.mu[:, :, :start], c.spks, c.cond[:, :, :start], steps, keep=start
    )
    assert len(prefixes) == steps and all(p.frames == start for p in prefixes)
    tail, _ = flow.decoder.solve_after(prefixes, c.mu[:, :, start:], c.spks, c.cond[:, :, start:], steps)
    torch.testing.assert_close(tail, full[:, :, start:], atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_prefixes_recorded_inside_longer_calls_chain_chunk_after_chunk(flow: Flow) -> None:
    """Each call runs past its whole chunks and keeps the state at the last chunk boundary, as a stream's calls
    would: call 1 over frames 0-129 keeps 100, call 2 over 100-209 keeps 200, call 3 runs 200 to the end."""
    steps = flow.config.cfm.n_timesteps
    c = _conditions(flow, prompt_tokens=40, target_tokens=90)  # 260 frames
    full = _full(flow, c, steps)
    prefixes = None
    for start, end, keep in ((0, 130, 100), (100, 210, 100), (200, 260, None)):
        mel, prefixes_next = flow.decoder.solve_after(
            prefixes, c.mu[:, :, start:end], c.spks, c.cond[:, :, start:end], steps, keep=keep
        )
        upto_end = _full(flow, replace(c, mu=c.mu[:, :, :end], cond=c.cond[:, :, :end]), steps)
        torch.testing.assert_close(mel, upto_end[:, :, start:], atol=1e-5, rtol=1e-5)
        if keep is not None:
            assert prefixes_next[0].frames == start + keep
        prefixes = prefixes_next
    torch.testing.assert_close(mel, full[:, :, 200:], atol=1e-5, rtol=1e-5)


def test_a_prefix_needs_streaming(flow: Flow) -> None:
    from tritontts.cosyvoice2.flow.prefix import PrefixRun

    mu = torch.zeros(2, 80, 10)
    with pytest.raises(ValueError, match="streaming"):
        flow.decoder.estimator(
            mu, torch.ones(2, 1, 10), mu, torch.zeros(2), torch.zeros(2, 80), mu, False, PrefixRun(None, 10)
        )


@torch.inference_mode()
def test_the_stable_prompt_frames_do_not_depend_on_the_target(flow: Flow) -> None:
    from tritontts.cosyvoice2.flow.voice_prefixes import stable_prompt_frames

    stable = stable_prompt_frames(60, flow.pre_lookahead_len, CHUNK // 2, 2)
    assert stable == 2 * CHUNK
    one, other = (_conditions(flow, 60, 28, target_seed=seed) for seed in (1, 2))
    torch.testing.assert_close(one.mu[:, :, :stable], other.mu[:, :, :stable], atol=1e-6, rtol=1e-6)
    assert not torch.allclose(one.mu[:, :, stable:120], other.mu[:, :, stable:120], atol=1e-3)


def test_voice_prefixes_keep_the_recent_voices_within_the_budget() -> None:
    from tritontts.cosyvoice2.flow.prefix import LayerPrefix
    from tritontts.cosyvoice2.flow.voice_prefixes import VoicePrefixes

    def prefixes(n_bytes: int) -> list[LayerPrefix]:
        return [LayerPrefix(50, keys=[torch.zeros(n_bytes, dtype=torch.uint8)])]

    store = VoicePrefixes(budget_bytes=250)
    a = store.get("a", lambda: prefixes(100))
    assert store.get("a", lambda: prefixes(1)) is a and store.made == 1
    store.get("b", lambda: prefixes(100))
    store.get("a", lambda: prefixes(1))  # a is now the most recent
    store.get("c", lambda: prefixes(100))  # b goes
    assert "a" in store and "c" in store and "b" not in store and store.nbytes == 200
    big = store.get("d", lambda: prefixes(300))  # over the budget alone: made, not kept
    assert big[0].keys[0].numel() == 300 and "d" not in store and store.made == 4


def test_a_voice_key_tells_voices_apart_in_any_dtype() -> None:
    from tritontts.cosyvoice2.flow.voice_prefixes import voice_key

    tokens = torch.arange(60, dtype=torch.int32).view(1, -1)
    feat = torch.randn(1, 120, 80, generator=torch.Generator().manual_seed(0))
    embedding = torch.ones(1, 192)
    key = voice_key(tokens, feat, embedding)
    assert voice_key(tokens.clone(), feat.clone(), embedding.clone()) == key
    assert voice_key(tokens, feat.to(torch.bfloat16), embedding) != key
    changed = feat.clone()
    changed[0, 119, 79] += 1
    assert voice_key(tokens, changed, embedding) != key
    assert voice_key(tokens[:, :59], feat, embedding) != key


@torch.inference_mode()
def test_rows_of_different_lengths_after_one_prefix_match_each_row_alone(flow: Flow) -> None:
    """Two calls of one voice, 28 and 53 target tokens, in one batch padded to the longer after a shared prefix."""
    steps = flow.config.cfm.n_timesteps
    short, long = (_conditions(flow, 60, n, target_seed=n) for n in (28, 53))
    start = 2 * CHUNK
    _, prefix = flow.decoder.solve_after(
        None, short.mu[:, :, :start], short.spks, short.cond[:, :, :start], steps, keep=start
    )
    frames = long.mu.size(2) - start
    mu = torch.zeros(2, 80, frames)
    cond = torch.zeros(2, 80, frames)
    mask = torch.zeros(2, 1, frames)
    for row, c in enumerate((short, long)):
        n = c.mu.size(2) - start
        mu[row, :, :n], cond[row, :, :n], mask[row, :, :n] = c.mu[0, :, start:], c.cond[0, :, start:], 1
    mel, _ = flow.decoder.solve_after(prefix, mu, torch.cat([short.spks, long.spks]), cond, steps, mask=mask)
    for row, c in enumerate((short, long)):
        n = c.mu.size(2) - start
        torch.testing.assert_close(
            mel[row : row + 1, :, :n], _full(flow, c, steps)[:, :, start:], atol=1e-5, rtol=1e-5
        )


@torch.inference_mode()
def test_decode_after_voices_gives_what_decode_gives(flow: Flow) -> None:
    """Three streamed calls of two voices (one voice twice, different lengths) and one whose prompt is too short
    for a prefix: the same mel as flow.decode, and each voice's prefix made once."""
    from tritontts.cosyvoice2.flow.voice_decode import decode_after_voices
    from tritontts.cosyvoice2.flow.voice_prefixes import VoicePrefixes

    calls = [_conditions(flow, 60, 28, 1), _conditions(flow, 60, 53, 2), _conditions(flow, 80, 30, 3)]
    calls.append(_conditions(flow, 20, 28, 4))
    voices = [("a", 60), ("a", 60), ("b", 80), ("c", 20)]
    store = VoicePrefixes(budget_bytes=1 << 30)
    mels = decode_after_voices(flow, calls, voices, store)
    for mel, expected in zip(mels, flow.decode(calls)):
        torch.testing.assert_close(mel, expected, atol=1e-5, rtol=1e-5)
    assert store.made == 2 and "a" in store and "b" in store
    again = decode_after_voices(flow, calls[:1], voices[:1], store)
    torch.testing.assert_close(again[0], mels[0])
    assert store.made == 2


def _graphed(flow: Flow, batch_sizes: tuple[int, ...], prefix_frames: tuple[int, ...]):
    from tritontts.cosyvoice2.flow.prefix_graphs import GraphedPrefixCFM
    from tritontts.cuda_graphs import FlowGraphConfig

    config = FlowGraphConfig(buckets=(64, 128, 192), batch_sizes=batch_sizes, streaming=(True,))
    return GraphedPrefixCFM(flow.decoder, flow.config.cfm.n_timesteps, config, prefix_frames)


def _prefix(flow: Flow, c, start: int):
    steps = flow.config.cfm.n_timesteps
    return flow.decoder.solve_after(
        None, c.mu[:, :, :start], c.spks, c.cond[:, :, :start], steps, keep=start
    )[1]


@torch.inference_mode()
def test_graphed_prefix_calls_padded_to_a_batch_and_bucket_match_each_row_alone(flow: Flow) -> None:
    """Without captured graphs (CPU) a call runs padded as a graph would: 3 rows to batch 4, 60-106 frames to the
    128 bucket; each row is what the unpadded run of it alone gives. Past the largest batch it runs unpadded."""
    steps = flow.config.cfm.n_timesteps
    calls = [_conditions(flow, 60, n, target_seed=n) for n in (28, 40, 51)]
    start = 2 * CHUNK
    prefix = _prefix(flow, calls[0], start)
    graphed = _graphed(flow, (1, 4), (start,))
    frames = max(c.mu.size(2) for c in calls) - start
    mu, cond, mask = torch.zeros(3, 80, frames), torch.zeros(3, 80, frames), torch.zeros(3, 1, frames)
    for row, c in enumerate(calls):
        n = c.mu.size(2) - start
        mu[row, :, :n], cond[row, :, :n], mask[row, :, :n] = c.mu[0, :, start:], c.cond[0, :, start:], 1
    spks = torch.cat([c.spks for c in calls])
    mel = graphed("a", prefix, mu, spks, cond, mask)
    assert mel.shape == (3, 80, frames) and graphed.calls["padded"] == 1
    for row, c in enumerate(calls):
        n = c.mu.size(2) - start
        alone, _ = flow.decoder.solve_after(prefix, c.mu[:, :, start:], c.spks, c.cond[:, :, start:], steps)
        torch.testing.assert_close(mel[row : row + 1, :, :n], alone, atol=1e-5, rtol=1e-5)
    wide = _graphed(flow, (1, 2), (start,))
    torch.testing.assert_close(wide("a", prefix, mu, spks, cond, mask), mel, atol=1e-5, rtol=1e-5)
    assert wide.calls["padded"] == 0


@torch.inference_mode()
def test_the_static_prefix_takes_a_voices_prefix_once_until_another_comes(flow: Flow) -> None:
    """The graphs' prefix buffers hold the longest length; a shorter prefix fills a view of their first frames,
    and is copied in again only for another voice or length."""
    graphed = _graphed(flow, (1,), (CHUNK, 2 * CHUNK))
    graphed._static = graphed._make_static(2 * CHUNK)
    a, b = _conditions(flow, 60, 28, 1), _conditions(flow, 80, 28, 2)
    short = _prefix(flow, a, CHUNK)
    graphed._load("a", short)
    graphed._load("a", short)
    assert graphed.calls["copied"] == 1
    view = graphed._static[3]
    torch.testing.assert_close(view.keys[-1][:, :, :CHUNK], short[3].keys[-1])
    torch.testing.assert_close(view.convs[-1], short[3].convs[-1])
    long = _prefix(flow, b, 2 * CHUNK)
    graphed._load("b", long)
    graphed._load("a", short)
    assert graphed.calls["copied"] == 3
    torch.testing.assert_close(graphed._static[-1].values[0][:, :, :CHUNK], short[-1].values[0])


@torch.inference_mode()
def test_decode_after_voices_through_the_graphed_runner_gives_what_decode_gives(flow: Flow) -> None:
    """Prefix lengths 50 and 100 frames, batches of at most 2: the 80-token prompt (150 stable frames) uses 100,
    the three calls of voice a run as two batches, the 20-token prompt has no prefix length and decodes whole, and
    so do the batches of one row (voice a's second, voice b's call), their voices' prefixes made all the same."""
    from tritontts.cosyvoice2.flow.voice_decode import decode_after_voices
    from tritontts.cosyvoice2.flow.voice_prefixes import VoicePrefixes

    calls = [_conditions(flow, 60, n, n) for n in (28, 40, 53)]
    calls += [_conditions(flow, 80, 30, 3), _conditions(flow, 20, 28, 4)]
    voices = [("a", 60)] * 3 + [("b", 80), ("c", 20)]
    store = VoicePrefixes(budget_bytes=1 << 30)
    graphed = _graphed(flow, (1, 2), (CHUNK, 2 * CHUNK))
    mels = decode_after_voices(flow, calls, voices, store, graphed)
    for mel, expected in zip(mels, flow.decode(calls)):
        torch.testing.assert_close(mel, expected, atol=1e-5, rtol=1e-5)
    assert store.made == 2 and graphed.calls["padded"] == 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tritontts.synthetic.cosyvoice2_hift import write_hift

    directory = tmp_path_factory.mktemp("cosyvoice2_tiny_token2wav")
    write_flow(directory, "tiny", seed=0)
    write_hift(directory, "tiny", seed=0)
    return directory


def test_token2wav_streams_with_voice_prefixes_sound_as_without(model_dir: Path) -> None:
    """Two streams of one 60-token voice and one of a 20-token voice (no prefix), first chunks together, then
    later chunks and the finalize calls: the same audio with the voice prefix cache as without it, the long
    voice's prefix made once."""
    from tritontts.cosyvoice2.token2wav import Token2Wav, Token2WavCall

    gen = torch.Generator().manual_seed(11)

    def voice(tokens: int):
        return (
            torch.randint(0, VOCAB, (1, tokens), generator=gen, dtype=torch.int32),
            torch.randn(1, 2 * tokens, 80, generator=gen),
            torch.randn(1, 192, generator=gen),
        )

    long, short = voice(60), voice(20)
    targets = {name: torch.randint(0, VOCAB, (1, 60), generator=gen, dtype=torch.int32) for name in "abc"}
    voices = {"a": long, "b": long, "c": short}
    rounds = [(0, 28, False), (25, 53, False), (50, 60, True)]

    def run(t2w: Token2Wav) -> dict[str, list[torch.Tensor]]:
        audio: dict[str, list[torch.Tensor]] = {name: [] for name in targets}
        for offset, end, finalize in rounds:
            calls = [
                Token2WavCall(targets[n][:, :end], *voices[n], n, offset, finalize) for n in sorted(targets)
            ]
            for name, result in zip(sorted(targets), t2w.run_many(calls)):
                assert not isinstance(result, Exception), result
                audio[name].append(result)
        return audio

    plain = run(Token2Wav.from_model_dir(model_dir))
    cached_t2w = Token2Wav.from_model_dir(model_dir, voice_prefix_bytes=1 << 30)
    cached = run(cached_t2w)
    for name in targets:
        for a, b in zip(cached[name], plain[name]):
            torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    assert cached_t2w.flow.voice_decoder.store.made == 1
