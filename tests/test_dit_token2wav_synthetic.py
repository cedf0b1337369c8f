"""The synthetic Step-Audio-2-mini token2wav folder and the HiFT widths read from hift.pt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tritontts.checkpoint import CheckpointError
from tritontts.cosyvoice2.hift import HiFTConfig
from tritontts.dit_token2wav.config import CFM_TAG, DIT_TAG, ENCODER_TAG, FLOW_TAG
from tritontts.dit_token2wav.token2wav import hift_config_of
from tritontts.synthetic.dit_token2wav import (
    FILES,
    flow_yaml,
    is_complete,
    preset_config,
    write_dit_token2wav,
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dit_token2wav(tmp_path_factory.mktemp("dit") / "token2wav", "tiny", seed=0)


def test_folder_has_the_hub_files(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted([*FILES, "SYNTHETIC.json"])
    assert FILES == ("flow.yaml", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v2_25hz.onnx")
    assert is_complete(folder, "tiny", 0)
    assert not is_complete(folder, "tiny", 1) and not is_complete(folder, "full", 0)


def test_flow_yaml_uses_the_hub_tags() -> None:
    for preset in ("tiny", "full"):
        text = flow_yaml(preset)
        for tag in (FLOW_TAG, ENCODER_TAG, CFM_TAG, DIT_TAG):
            assert text.count(tag) == 1
    tiny = preset_config("tiny")
    assert (tiny.encoder.output_size, tiny.estimator.depth, tiny.estimator.hidden_size, tiny.vocab_size) == (
        64,
        2,
        64,
        6561,
    )


def test_same_seed_same_bytes(folder: Path, tmp_path: Path) -> None:
    again = write_dit_token2wav(tmp_path / "again", "tiny", seed=0)
    other = write_dit_token2wav(tmp_path / "other", "tiny", seed=1)
    for name in ("flow.yaml", "flow.pt", "hift.pt"):
        assert (again / name).read_bytes() == (folder / name).read_bytes(), name
    assert (other / "flow.pt").read_bytes() != (folder / "flow.pt").read_bytes()
    with pytest.raises(ValueError, match="huge"):
        write_dit_token2wav(tmp_path / "bad", "huge")


def test_hift_widths_come_from_the_file(folder: Path, tmp_path: Path) -> None:
    assert hift_config_of(folder / "hift.pt") == HiFTConfig(base_channels=32, f0_cond_channels=32)
    # Upstream builds HiFTGenerator() without arguments: a full-size file gives exactly its defaults,
    # also with the `generator.` prefix and pre-2.1 weight-norm names.
    full = {
        "generator.conv_pre.weight_v": torch.zeros(512, 80, 7),
        "generator.f0_predictor.classifier.weight": torch.zeros(1, 512),
    }
    torch.save(full, tmp_path / "hift.pt")
    assert hift_config_of(tmp_path / "hift.pt") == HiFTConfig()
    torch.save({"conv_post.bias": torch.zeros(18)}, tmp_path / "hift.pt")
    with pytest.raises(CheckpointError, match="conv_pre"):
        hift_config_of(tmp_path / "hift.pt")
