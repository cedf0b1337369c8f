"""Spark-TTS's audio side as one object: reference audio → voice tokens, tokens → 16 kHz audio."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tritontts.devices import resolve_device
from tritontts.spark.audio import reference_clip, volume_normalize
from tritontts.spark.bicodec import load_bicodec
from tritontts.spark.config import SparkAudioConfig
from tritontts.spark.padded_detokenize import PaddedDetokenizer, PaddedPasses
from tritontts.spark.service import VoiceTokens
from tritontts.wav2vec2 import load_wav2vec2


class SparkCodec:
    """wav2vec2 features + BiCodec. Lists in, lists out; batched inside."""

    def __init__(
        self,
        model_dir: str | Path,
        device: str | torch.device = "auto",
        dtype: torch.dtype = torch.float32,
        with_tokenizer: bool = True,
        cuda_graphs: bool = True,
        passes: PaddedPasses | None = None,
        reference_bucket: int | None = None,
        compile_vocoder: bool = False,
    ) -> None:
        """`cuda_graphs`: on CUDA, detokenize replays its padded passes from CUDA graphs (see PaddedDetokenizer);
        `compile_vocoder`: the passes compiled by torch.compile (captured so where there are graphs).
        `reference_bucket`: tokenize pads reference audio to a multiple of this many samples (default one
        second on CUDA, where a new length costs convolution plans, with wav2vec2's per-frame layer norm; none
        elsewhere)."""
        model_dir = Path(model_dir)
        self.device = resolve_device(device)
        self.config = SparkAudioConfig.from_yaml(model_dir / "config.yaml")
        self.bicodec = load_bicodec(model_dir / "BiCodec", self.device, dtype)
        self.detokenizer = PaddedDetokenizer(
            self.bicodec, passes, cuda_graphs=cuda_graphs, compile=compile_vocoder
        )
        self.wav2vec2 = (
            load_wav2vec2(model_dir / "wav2vec2-large-xlsr-53", self.device, dtype)
            if with_tokenizer
            else None
        )
        if reference_bucket is None:
            per_frame = self.wav2vec2 is not None and self.wav2vec2.config.feat_extract_norm == "layer"
            reference_bucket = self.config.sample_rate if self.device.type == "cuda" and per_frame else 0
        self.reference_bucket = reference_bucket

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @torch.inference_mode()
    def tokenize(self, wavs: Sequence[np.ndarray]) -> list[VoiceTokens]:
        """Reference audios (mono float at 16 kHz, already checked) → their global and semantic tokens."""
        if self.wav2vec2 is None:
            raise RuntimeError("this SparkCodec was built without its audio tokenizer (with_tokenizer=False)")
        if self.config.volume_normalize:
            wavs = [volume_normalize(np.asarray(w, dtype=np.float32)) for w in wavs]
        clips = np.stack([reference_clip(w, self.config.ref_segment_length) for w in wavs])
        features, frames = self.wav2vec2.spark_features(list(wavs), pad_multiple=self.reference_bucket)
        ref = torch.from_numpy(clips).to(self.device, self.bicodec.dtype)
        global_ids, semantic_ids = self.bicodec.tokenize(features, ref, frames.to(self.device))
        global_ids, semantic_ids = global_ids.cpu().numpy(), semantic_ids.cpu().numpy()
        return [
            VoiceTokens(global_ids[i].astype(np.int32), semantic_ids[i, : int(n)].astype(np.int32))
            for i, n in enumerate(frames.tolist())
        ]

    def warm_tokenizer(self, max_seconds: float) -> int:
        """Tokenize one reference of each bucket length up to `max_seconds` (with `reference_bucket` set), so
        requests find their shapes' convolution plans made; returns how many."""
        if not self.reference_bucket or self.wav2vec2 is None:
            return 0
        bucket = self.reference_bucket
        lengths = range(bucket, -(-int(max_seconds * self.sample_rate) // bucket) * bucket + 1, bucket)
        noise = np.random.default_rng(0).standard_normal(lengths[-1]).astype(np.float32)
        for samples in lengths:
            self.tokenize([0.1 * noise[:samples]])
        return len(lengths)

    def detokenize(
        self, global_tokens: Sequence[np.ndarray], semantic_tokens: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """Token sequences (any lengths) → 16 kHz audio, `len(semantic) * 320` samples each."""
        return self.detokenizer.detokenize(global_tokens, semantic_tokens)
