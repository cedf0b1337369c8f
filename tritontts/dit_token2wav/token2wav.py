"""Step-Audio-2-mini token2wav: speech tokens → 24 kHz audio, offline or streamed, from the hub's files.

A speaker (`tritontts.dit_token2wav.speaker`) is prepared once per reference recording (cached by its
content): prompt tokens from the 25 Hz speech tokenizer, the CAMPPlus x-vector and the 24 kHz prompt mel.

Streaming follows upstream's Triton `token2wav_dit` model: a call passes the chunk's tokens with its
`pre_lookahead_len` look-ahead tokens at the end (the next call starts with them again; the last call,
`finalize`, passes the rest). The flow continues the request's caches, its estimator keys then cut to the
first prompt-frames and the last 100 entries (upstream's order, newest chunk first); HiFT vocodes the
previous call's last 8 mel frames + the new ones with the previous source over those 8 frames,
cross-fades its first 8 frames of audio with the previous call's tail (Hamming, 2 * 3840 samples) and
withholds its own last 8 frames until the next call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from tritontts.audio import check_waveform
from tritontts.checkpoint import CheckpointError, read_state_dict
from tritontts.cosyvoice2.frontend import (
    CAMPPLUS_FILE,
    INPUT_SAMPLE_RATE,
    REFERENCE_FIELD,
    TOKENIZER_LIMITS,
    SpeakerEmbedder,
    SpeechTokenizer,
    has_cuda_provider,
    prompt_speech_feat,
    speaker_fbank,
)
from tritontts.cosyvoice2.hift import HIFT_FILE, HiFT, HiFTConfig, load_hift, official_key
from tritontts.cosyvoice2.token2wav import fade_in_out
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.devices import mark_on_device, resolve_device, resolve_dtype
from tritontts.dit_token2wav.cfm import KeyWindow
from tritontts.dit_token2wav.config import FLOW_YAML
from tritontts.dit_token2wav.flow import DiTFlow, FlowCache, FlowChunk, FlowUtterance, load_dit_flow, unwrap
from tritontts.dit_token2wav.speaker import DiTSpeaker, speaker_from_features, speech_token_ids
from tritontts.dsp.hann_sinc_resample import hann_sinc_resample
from tritontts.stage_timer import StageTimer
from tritontts.stream_states import DEFAULT_IDLE_TIMEOUT_S, StreamStates
from tritontts.voice_cache import VoiceCache, audio_key

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2_25hz.onnx"
SAMPLE_RATE = 24000
MEL_CACHE_FRAMES = 8
ESTIMATOR_CACHE_TAIL = 100
SPEAKER_CACHE_SIZE = 8
_HIFT_BASE_KEY = "conv_pre.parametrizations.weight.original1"
_HIFT_F0_KEY = "f0_predictor.classifier.weight"

__all__ = [
    "CAMPPLUS_FILE",
    "FLOW_YAML",
    "HIFT_FILE",
    "SPEECH_TOKENIZER_FILE",
    "DiTStreamCall",
    "DiTToken2Wav",
]


def hift_config_of(path: str | Path) -> HiFTConfig:
    """HiFTGenerator's defaults (upstream builds it without arguments), with the widths `hift.pt` holds."""
    state = {official_key(k): v for k, v in read_state_dict(path).items()}
    for key in (_HIFT_BASE_KEY, _HIFT_F0_KEY):
        if key not in state:
            raise CheckpointError(f"{path} does not match HiFT: missing keys: {key}")
    return HiFTConfig(
        base_channels=state[_HIFT_BASE_KEY].shape[0], f0_cond_channels=state[_HIFT_F0_KEY].shape[1]
    )


@dataclass(frozen=True)
class DiTStreamCall:
    """One call of a stream: its request id, speaker, tokens (look-ahead last) and whether it is the last."""

    request_id: str
    speaker: DiTSpeaker
    tokens: list[int] | np.ndarray | Tensor
    finalize: bool


@dataclass
class _Stream:
    flow_cache: FlowCache
    generator: torch.Generator | None
    mel: Tensor | None = None
    """HiFT's last `MEL_CACHE_FRAMES` input frames"""
    source: Tensor | None = None
    """HiFT's source over those frames"""
    speech: Tensor | None = None
    """audio over those frames, withheld until the next call"""


class DiTToken2Wav:
    """The DiT flow (in `dtype`) and HiFT (fp32) on one device, with the prompt front end on ONNX Runtime.

    `seed` makes HiFT's noise reproducible: each offline call and each stream starts a generator from it
    (None: torch's global RNG, as upstream). Different request ids may be streamed from different threads.
    """

    def __init__(
        self,
        flow: DiTFlow,
        hift: HiFT,
        tokenizer: SpeechTokenizer | None = None,
        speaker_embedder: SpeakerEmbedder | None = None,
        seed: int | None = 0,
        speaker_cache_size: int = SPEAKER_CACHE_SIZE,
        stream_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> None:
        self.flow = flow
        self.hift = hift
        self.tokenizer = tokenizer
        self.speaker_embedder = speaker_embedder
        self.seed = seed
        self.device = flow.device
        self.token_mel_ratio = flow.config.token_mel_ratio
        self.pre_lookahead_len = flow.config.pre_lookahead_len
        self.vocab_size = flow.config.vocab_size
        self.samples_per_frame = hift.config.samples_per_frame
        self.source_cache_len = MEL_CACHE_FRAMES * self.samples_per_frame
        window = torch.hamming_window(2 * self.source_cache_len, periodic=False, dtype=torch.float64)
        self.speech_window = window.to(self.device)
        self.speakers: VoiceCache[DiTSpeaker] = VoiceCache(speaker_cache_size)
        self._streams: StreamStates[_Stream] = StreamStates(stream_idle_timeout_s)

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "auto",
        dtype: torch.dtype | str = torch.float32,
        seed: int | None = 0,
        speaker_cache_size: int = SPEAKER_CACHE_SIZE,
        flow_graphs: FlowGraphConfig | None = None,
        stream_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    ) -> DiTToken2Wav:
        """The `token2wav/` folder: flow.yaml, flow.pt, hift.pt, campplus.onnx, speech_tokenizer_v2_25hz.onnx.

        The tokenizer runs on the GPU when the device is one and ONNX Runtime has CUDA, CAMPPlus on the
        CPU (as upstream). `flow_graphs` (CUDA only; a `DiTFlowGraphConfig` also sets the chunk and cache
        buckets): capture the flow decoder's CUDA graphs now and replay them for every call that fits one."""
        model_dir = Path(model_dir)
        device = resolve_device(device)
        flow = load_dit_flow(model_dir, device, resolve_dtype(dtype))
        if flow_graphs is not None:
            flow.use_cuda_graphs(flow_graphs)
        hift_path = model_dir / HIFT_FILE
        hift = load_hift(hift_path, hift_config_of(hift_path), device)
        if flow_graphs is not None:
            hift.use_cuda_graphs()
        tokenizer_device = str(device) if device.type == "cuda" and has_cuda_provider() else "cpu"
        return cls(
            flow,
            hift,
            SpeechTokenizer(model_dir / SPEECH_TOKENIZER_FILE, tokenizer_device),
            SpeakerEmbedder(model_dir / CAMPPLUS_FILE, "cpu"),
            seed,
            speaker_cache_size,
            stream_idle_timeout_s,
        )

    def _generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(self.seed)

    def _token_ids(self, tokens: list[int] | np.ndarray | Tensor) -> Tensor:
        return speech_token_ids(tokens, self.vocab_size, self.device)

    def speaker_from_features(
        self, prompt_tokens: np.ndarray, prompt_mel: np.ndarray, embedding: np.ndarray, key: str = ""
    ) -> DiTSpeaker:
        """A speaker from its front-end outputs: tokens [n], mel [F, 80] at 24 kHz, x-vector [192]."""
        return speaker_from_features(self.flow, prompt_tokens, prompt_mel, embedding, key)

    def prepare_speaker(self, wav_16k: np.ndarray, name: str = REFERENCE_FIELD) -> DiTSpeaker:
        """A 16 kHz mono float reference (at most 30 s) → its speaker, computed once per distinct audio."""
        if self.tokenizer is None or self.speaker_embedder is None:
            raise RuntimeError("this DiTToken2Wav has no front end; build it with from_model_dir")
        wav = check_waveform(wav_16k, INPUT_SAMPLE_RATE, TOKENIZER_LIMITS, name)
        key = audio_key(wav, INPUT_SAMPLE_RATE)

        def compute() -> DiTSpeaker:
            samples = torch.from_numpy(wav)
            tokens = self.tokenizer(wav, name)
            mel = prompt_speech_feat(hann_sinc_resample(samples, INPUT_SAMPLE_RATE, SAMPLE_RATE))
            embedding = self.speaker_embedder.embed_fbank(speaker_fbank(samples).numpy())
            return self.speaker_from_features(tokens, mel, embedding, key)

        speaker, _ = self.speakers.get_or_compute(key, compute)
        return speaker

    def _vocode(
        self, mel: Tensor, cache_source: Tensor | None, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        return self.hift.inference(mel.to(self.device, torch.float32), cache_source, generator)

    def offline(self, tokens: list[int] | np.ndarray, speaker: DiTSpeaker) -> np.ndarray:
        """Raw speech token ids [n] → float32 audio [n * 2 * 480] at 24 kHz (the flow in one pass)."""
        return unwrap(self.offline_many([(tokens, speaker)])[0])

    def offline_many(
        self, utterances: Sequence[tuple[list[int] | np.ndarray, DiTSpeaker]]
    ) -> list[np.ndarray | Exception]:
        """`offline` of each (tokens, speaker) (or what it raised), their flows decoded in batches where the
        flow's graphs allow, then HiFT utterance by utterance."""
        results: list[np.ndarray | Exception | None] = [None] * len(utterances)
        flowing, slots = [], []
        for slot, (tokens, speaker) in enumerate(utterances):
            try:
                ids = self._token_ids(tokens)
            except ValueError as err:
                results[slot] = err
                continue
            if ids.shape[1] == 0:
                results[slot] = np.zeros(0, dtype=np.float32)
                continue
            prompted = torch.cat([speaker.prompt_tokens, ids], dim=1)
            flowing.append(FlowUtterance(prompted, speaker.prompt_mel, speaker.embedding))
            slots.append(slot)
        for slot, mel in zip(slots, self.flow.inference_many(flowing)):
            if isinstance(mel, Exception):
                results[slot] = mel
                continue
            try:
                frames = utterances[slot][1].prompt_frames
                speech, _ = self._vocode(mel[:, :, frames:], None, self._generator())
                results[slot] = speech[0].cpu().numpy()
            except Exception as err:  # this utterance fails alone
                results[slot] = err
        return results

    def _check_chunk(self, request_id: str, state: _Stream, count: int, finalize: bool) -> None:
        if finalize:
            return
        if count <= self.pre_lookahead_len:
            raise ValueError(
                f"stream {request_id}: a chunk needs more than {self.pre_lookahead_len} tokens "
                f"(its last {self.pre_lookahead_len} are look-ahead), got {count}"
            )
        frames = self.token_mel_ratio * (count - self.pre_lookahead_len)
        held = 0 if state.mel is None else state.mel.shape[2]
        if held + frames <= MEL_CACHE_FRAMES:
            raise ValueError(
                f"stream {request_id}: a chunk's audio must outlast the {MEL_CACHE_FRAMES} withheld mel frames; "
                f"{count} tokens give {frames} frames"
            )

    def stream(
        self,
        request_id: str,
        speaker: DiTSpeaker,
        tokens: list[int] | np.ndarray,
        finalize: bool,
        timer: StageTimer | None = None,
    ) -> np.ndarray:
        """The next piece of a request's audio (float32, 24 kHz).

        `tokens` is the chunk with its look-ahead tokens at the end (the next chunk starts with those again),
        or with `finalize` the rest of the utterance. The first call of a request id opens its state (from
        `speaker`, which every later call of the request must pass again), the finalize call returns the
        withheld tail and frees it. Calls for one request id must not overlap. `timer` gets the stages "flow"
        and "vocoder", the GPU synchronized at each mark.
        """
        return unwrap(self.stream_many([DiTStreamCall(request_id, speaker, tokens, finalize)], timer)[0])

    def stream_many(
        self, calls: Sequence[DiTStreamCall], timer: StageTimer | None = None
    ) -> list[np.ndarray | Exception]:
        """`stream` of each call (or what it raised), the flows of calls of different streams decoded in
        batches where the flow's graphs allow; two calls of one stream run one after the other, in order."""
        results: list[np.ndarray | Exception | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        while pending:
            seen: set[str] = set()
            now, later = [], []
            for i in pending:
                (later if calls[i].request_id in seen else now).append(i)
                seen.add(calls[i].request_id)
            self._stream_round([calls[i] for i in now], now, results, timer)
            pending = later
        return results

    @staticmethod
    def _key_window(speaker: DiTSpeaker) -> KeyWindow:
        """A stream's estimator keeps its prompt's key frames and the last ESTIMATOR_CACHE_TAIL."""
        return speaker.prompt_frames, ESTIMATOR_CACHE_TAIL

    def _open(self, call: DiTStreamCall) -> tuple[_Stream, Tensor]:
        ids = self._token_ids(call.tokens)
        state = self._streams.get(call.request_id)
        fresh = state is None
        if fresh:
            state = _Stream(call.speaker.cache, self._generator())
        self._check_chunk(call.request_id, state, ids.shape[1], call.finalize)
        if fresh:
            self._streams.put(call.request_id, state)
        return state, ids

    def _stream_round(
        self,
        calls: list[DiTStreamCall],
        slots: list[int],
        results: list[np.ndarray | Exception | None],
        timer: StageTimer | None,
    ) -> None:
        opened: list[tuple[DiTStreamCall, int, _Stream, Tensor]] = []
        for call, slot in zip(calls, slots):
            try:
                opened.append((call, slot, *self._open(call)))
            except ValueError as err:
                results[slot] = err
        flowing = [o for o in opened if o[3].shape[1] > 0]
        chunks = [
            FlowChunk(ids, c.speaker.embedding, s.flow_cache, c.finalize, self._key_window(c.speaker))
            for c, _, s, ids in flowing
        ]
        flowed = dict(zip((slot for _, slot, _, _ in flowing), self.flow.inference_chunks(chunks)))
        mark_on_device(timer, "flow", self.device)
        for call, slot, state, _ in opened:
            try:
                results[slot] = self._continue(call, state, flowed.get(slot))
            except Exception as err:  # this stream fails alone
                self.cancel(call.request_id)
                results[slot] = err
        mark_on_device(timer, "vocoder", self.device)

    def _continue(
        self, call: DiTStreamCall, state: _Stream, flowed: tuple[Tensor, FlowCache] | None
    ) -> np.ndarray:
        """The call's audio from its new mel (None: no new token), the stream's state carried on or freed."""
        flow_cache, mel = state.flow_cache, state.mel
        if flowed is not None:
            chunk_mel, flow_cache = flowed
            chunk_mel = chunk_mel.to(self.device, torch.float32)
            mel = chunk_mel if mel is None else torch.cat([mel, chunk_mel], dim=2)
        if mel is None:
            self.cancel(call.request_id)
            return np.zeros(0, dtype=np.float32)
        speech, source = self._vocode(mel, state.source, state.generator)
        if state.speech is not None:
            speech = fade_in_out(speech, state.speech, self.speech_window)
        if call.finalize:
            self.cancel(call.request_id)
            return speech[0].cpu().numpy()
        if self._streams.holds(call.request_id, state):
            state.flow_cache = flow_cache
            state.mel = mel[:, :, -MEL_CACHE_FRAMES:]
            state.source = source[:, :, -self.source_cache_len :]
            state.speech = speech[:, -self.source_cache_len :]
        return speech[0, : -self.source_cache_len].cpu().numpy()

    def cancel(self, request_id: str) -> None:
        """Drop a request's state; nothing happens for an unknown id."""
        self._streams.pop(request_id)

    @property
    def open_streams(self) -> list[str]:
        """The streams whose state is kept (one unused for the idle timeout is dropped)."""
        return self._streams.ids()
