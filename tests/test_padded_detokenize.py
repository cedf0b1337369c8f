"""BiCodec's padded passes: each item's audio equals its audio alone, however it is padded and batched."""

import numpy as np
import pytest
import torch

from tritontts.cuda_graphs import compile_wanted
from tritontts.spark.bicodec import load_bicodec
from tritontts.spark.frame_mask import temporal_convs
from tritontts.spark.layers import WNConvTranspose1d
from tritontts.spark.padded_detokenize import PaddedDetokenizer, PaddedPasses
from tritontts.synthetic.bicodec import write_bicodec

LENGTHS = [37, 5, 60, 12, 12, 1, 49]


@pytest.fixture(scope="module")
def bicodec(tmp_path_factory):
    path = tmp_path_factory.mktemp("bicodec")
    write_bicodec(path, preset="tiny", seed=3)
    return load_bicodec(path / "BiCodec")


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(0)
    globals_ = [rng.integers(0, 4096, 32) for _ in LENGTHS]
    return globals_, [rng.integers(0, 8192, n) for n in LENGTHS]


def alone(bicodec, g, s) -> np.ndarray:
    with torch.inference_mode():
        audio = bicodec.detokenize(torch.as_tensor(g)[None], torch.as_tensor(s)[None])
    return audio[0].numpy()


SMALL = PaddedPasses(frame_buckets=(16, 64), batch_buckets=(1, 2, 4), max_padded_frames=128, warm_frames=0)


@pytest.mark.parametrize(
    ("passes", "bucketed"),
    [(PaddedPasses(), False), (SMALL, True)],
    ids=["padded to the longest", "buckets, rows of length 0, several passes"],
)
def test_every_item_equals_its_audio_alone(bicodec, tokens, passes, bucketed):
    detokenizer = PaddedDetokenizer(bicodec, passes, bucketed=bucketed)
    audios = detokenizer.detokenize(*tokens)
    assert [a.size for a in audios] == [n * bicodec.hop_length for n in LENGTHS]
    for g, s, audio in zip(*tokens, audios):
        expected = alone(bicodec, g, s)
        np.testing.assert_allclose(audio, expected, atol=2e-5)
        assert np.abs(expected).max() > 1e-3


def test_without_the_mask_padding_changes_the_end(bicodec, tokens):
    detokenizer = PaddedDetokenizer(bicodec, SMALL, bucketed=True)
    for handle in detokenizer.mask.handles:
        handle.remove()
    (g, *_), (s, *_) = tokens
    (audio,) = detokenizer.detokenize([g], [s])
    assert np.abs(audio - alone(bicodec, g, s)).max() > 1e-3


def test_passes_respect_the_buckets_and_the_frame_budget(bicodec):
    detokenizer = PaddedDetokenizer(bicodec, SMALL, bucketed=True)
    passes = detokenizer.plan(LENGTHS)
    assert sorted(i for p in passes for i in p) == list(range(len(LENGTHS)))
    for items in passes:
        longest = max(LENGTHS[i] for i in items)
        assert LENGTHS[items[0]] == longest
        assert SMALL.batch_for(len(items)) * SMALL.frames_for(longest) <= SMALL.max_padded_frames
    assert [len(p) for p in passes] == [2, 1, 4]  # 60+49 and 37 at 64 frames; the rest at 16


def test_the_mask_covers_every_frame_mixing_layer(bicodec):
    convs = temporal_convs(bicodec.decoder)
    upsampling = [c for c in convs if isinstance(c, WNConvTranspose1d)]
    assert len(upsampling) == len(bicodec.config.decoder.rates)
    assert temporal_convs(bicodec.prenet)


def test_passes_warmed_at_load_are_the_ones_requests_replay(bicodec, tokens):
    from test_shape_graphs import cpu_capture

    passes = PaddedPasses(
        frame_buckets=(16, 64), batch_buckets=(1, 2, 4), max_padded_frames=128, warm_frames=64
    )
    detokenizer = PaddedDetokenizer(bicodec, passes, bucketed=True, capture=cpu_capture)
    # 16 frames at 1, 2 and 4 rows; 64 frames at 1 and 2 (4 x 64 is past 128)
    assert detokenizer.warm() == 5 and detokenizer.graphs.captured == 5
    eager, replays = detokenizer.graphs.eager_calls, detokenizer.graphs.replays
    audios = detokenizer.detokenize(*tokens)
    assert detokenizer.graphs.eager_calls == eager
    assert detokenizer.graphs.replays - replays == len(detokenizer.plan(LENGTHS)) == 3
    for g, s, audio in zip(*tokens, audios):
        np.testing.assert_allclose(audio, alone(bicodec, g, s), atol=2e-5)


def test_compiled_passes_equal_each_item_alone(bicodec, tokens):
    one_shape = PaddedPasses(frame_buckets=(64,), batch_buckets=(1,), max_padded_frames=64, warm_frames=0)
    detokenizer = PaddedDetokenizer(bicodec, one_shape, bucketed=True, compile=True)
    assert detokenizer.run_pass is not detokenizer._pass
    (g0, _, g2, *_), (s0, _, s2, *_) = tokens  # 37 and 60 frames, each padded to 64: one compilation
    audios = detokenizer.detokenize([g0, g2], [s0, s2])
    for g, s, audio in zip([g0, g2], [s0, s2], audios):
        np.testing.assert_allclose(audio, alone(bicodec, g, s), atol=2e-5)


def test_the_vocoder_compile_parameter():
    assert compile_wanted("auto", graphs=True) and not compile_wanted("auto", graphs=False)
    assert compile_wanted("true", graphs=True) and not compile_wanted("false", graphs=True)
    with pytest.raises(ValueError, match="compile true needs CUDA graphs"):
        compile_wanted("true", graphs=False)
    with pytest.raises(ValueError, match="compile must be auto, true or false, got 'yes'"):
        compile_wanted("yes", graphs=True)
