"""CosyVoice2 token2wav: the flow (speech tokens → mel) then HiFT (mel → 24 kHz audio), offline or streamed.

Streaming follows upstream's Triton `token2wav` model: each call runs the flow over every target token so far
(the last `pre_lookahead_len` of them only as look-ahead unless `finalize`), keeps the mel from
`token_offset * token_mel_ratio` on, prepends the previous call's last 8 mel frames, vocodes with the
previous source over those frames, cross-fades the first 8 frames of audio with the previous call's tail
(a Hamming window of 2 * 3840 samples), and withholds its own last 8 frames of audio until the next call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from tritontts.cosyvoice2.flow.voice_prefixes import voice_key
from tritontts.cosyvoice2.hift import HIFT_FILE, HiFT, HiFTConfig, load_hift
from tritontts.cuda_graphs import FlowGraphConfig
from tritontts.devices import mark_on_device
from tritontts.stage_timer import StageTimer
from tritontts.stream_states import DEFAULT_IDLE_TIMEOUT_S, StreamStates

MEL_CACHE_FRAMES = 8
TOKEN_MEL_RATIO = 2
CONFIG_FILE = "cosyvoice2.yaml"


class FlowModel(Protocol):
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
    ) -> Tensor: ...

    def inference_many(self, requests: Sequence[dict[str, Any]]) -> list[Tensor | ValueError]: ...


def align_prompt(prompt_tokens: Tensor, prompt_feat: Tensor) -> tuple[Tensor, Tensor]:
    """Cut prompt tokens `[1, n]` and prompt mel `[1, T, 80]` to `m = min(T // 2, n)` tokens and `2 m` frames."""
    count = min(prompt_feat.shape[1] // TOKEN_MEL_RATIO, prompt_tokens.shape[1])
    return prompt_tokens[:, :count], prompt_feat[:, : TOKEN_MEL_RATIO * count]


def flow_request(
    target: Tensor,
    prompt_tokens: Tensor,
    prompt_feat: Tensor,
    embedding: Tensor,
    streaming: bool,
    finalize: bool,
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, Any]:
    """The keyword arguments of `FlowModel.inference` for one call (tokens `[1, n]`, mel `[1, T, 80]`)."""

    def length(t: Tensor) -> Tensor:
        return torch.tensor([t.shape[1]], dtype=torch.int32, device=device)

    return {
        "token": target.to(device, torch.int32),
        "token_len": length(target),
        "prompt_token": prompt_tokens.to(device, torch.int32),
        "prompt_token_len": length(prompt_tokens),
        "prompt_feat": prompt_feat.to(device, dtype),
        "prompt_feat_len": length(prompt_feat),
        "embedding": embedding.to(device, dtype),
        "streaming": streaming,
        "finalize": finalize,
    }


def fade_in_out(fade_in: Tensor, fade_out: Tensor, window: Tensor) -> Tensor:
    """Blend the first half-window of `fade_in` with the last half-window of `fade_out` (float64, as upstream)."""
    overlap = window.shape[0] // 2
    blended = (
        fade_in[..., :overlap].double() * window[:overlap]
        + fade_out[..., -overlap:].double() * window[overlap:]
    )
    out = fade_in.clone()
    out[..., :overlap] = blended.to(out.dtype)
    return out


@dataclass(frozen=True)
class StreamChunk:
    token_end: int
    """Call token2wav with the first `token_end` target tokens."""
    token_offset: int
    finalize: bool


STRATEGIES = ("exponential", "fixed", "time_based")
"""Upstream BLS's `dynamic_chunk_strategy` values (CosyVoice2's and CosyVoice3's), and ours: `fixed`."""


@dataclass(frozen=True)
class StreamSchedule:
    """When a BLS calls token2wav: once `token_offset + hop + pre_lookahead_len` target tokens exist.

    The first hop is `token_hop_len`. After chunk k (0-based) the next hop is, by strategy:
    - `fixed`: `token_hop_len` again;
    - `exponential` (upstream's default): `token_frame_rate * 2 ** k`: 15, 25, 50, 100...;
    - `time_based` (upstream's other strategy): from chunk 1 on, how far the audio sent is ahead of the time
      spent, in average chunk times: more than 4 → every pending token rounded up to a multiple of
      `token_hop_len`, more than 2 → rounded down, else `token_hop_len`; never less than `token_hop_len`.
    """

    token_hop_len: int = 15
    pre_lookahead_len: int = 3
    exponential: bool = False
    token_frame_rate: int = 25
    time_based: bool = False

    @classmethod
    def from_strategy(
        cls, strategy: str, token_hop_len: int = 15, pre_lookahead_len: int = 3
    ) -> StreamSchedule:
        if strategy not in STRATEGIES:
            raise ValueError(f"dynamic_chunk_strategy must be one of {STRATEGIES}, got {strategy!r}")
        return cls(
            token_hop_len,
            pre_lookahead_len,
            exponential=strategy == "exponential",
            time_based=strategy == "time_based",
        )

    def hop_len(self, chunk_index: int) -> int:
        """The hop of chunk `chunk_index` where it depends on nothing else (every strategy but time_based)."""
        if self.time_based:
            raise ValueError("time_based hops depend on the stream's timing: use next_hop")
        if not self.exponential or chunk_index == 0:
            return self.token_hop_len
        return self.token_frame_rate * 2 ** (chunk_index - 1)

    def next_hop(self, chunk_index: int, token_offset: int, tokens_so_far: int, elapsed_s: float) -> int:
        """The hop of chunk `chunk_index + 1`, decided once chunk `chunk_index` was sent: `token_offset` tokens
        are behind it, `tokens_so_far` have arrived, `elapsed_s` seconds passed since the stream's LLM started."""
        if not self.time_based:
            return self.hop_len(chunk_index + 1)
        hop = self.token_hop_len
        if chunk_index == 0 or elapsed_s <= 0:
            return hop
        average = elapsed_s / (chunk_index + 1)
        ahead = (token_offset / self.token_frame_rate - elapsed_s) / average
        pending = tokens_so_far - token_offset
        if ahead > 4:
            hop = (pending // self.token_hop_len + 1) * self.token_hop_len
        elif ahead > 2:
            hop = (pending // self.token_hop_len) * self.token_hop_len
        return max(self.token_hop_len, hop)

    def next_boundary(self, token_offset: int, chunk_index: int) -> int:
        """Target tokens needed before chunk `chunk_index` (starting at `token_offset`) can be vocoded."""
        return token_offset + self.hop_len(chunk_index) + self.pre_lookahead_len

    def plan(self, num_tokens: int) -> list[StreamChunk]:
        """The calls for `num_tokens` target tokens once all have arrived: full chunks, then one finalize."""
        chunks, offset, index = [], 0, 0
        while num_tokens >= self.next_boundary(offset, index):
            chunks.append(StreamChunk(self.next_boundary(offset, index), offset, finalize=False))
            offset += self.hop_len(index)
            index += 1
        chunks.append(StreamChunk(num_tokens, offset, finalize=True))
        return chunks


@dataclass
class _StreamState:
    generator: torch.Generator | None
    mel: Tensor | None = None
    """The last `MEL_CACHE_FRAMES` mel frames fed to HiFT."""
    source: Tensor | None = None
    """HiFT's source over those frames."""
    speech: Tensor | None = None
    """Audio over those frames, withheld until the next call."""


@dataclass(frozen=True)
class Token2WavCall:
    """One offline call (`stream_id` None) or one call of a stream, as `Token2Wav.offline` / `stream` take them."""

    target_tokens: Tensor
    prompt_tokens: Tensor
    prompt_feat: Tensor
    embedding: Tensor
    stream_id: str | None = None
    token_offset: int = 0
    finalize: bool = True

    @property
    def first_of_stream(self) -> bool:
        return self.stream_id is not None and self.token_offset == 0 and not self.finalize


class Token2Wav:
    """Owns a flow and a HiFT; batch 1, as upstream. `seed` makes the vocoder noise reproducible (None: torch's
    global RNG, as upstream): each offline call and each stream starts a generator from it."""

    def __init__(
        self,
        flow: FlowModel,
        hift: HiFT,
        token_mel_ratio: int = TOKEN_MEL_RATIO,
        device: str | torch.device = "cpu",
        flow_dtype: torch.dtype = torch.float32,
        seed: int | None = 0,
        mel_cache_frames: int = MEL_CACHE_FRAMES,
        stream_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        voice_keys: bool = False,
    ) -> None:
        self.flow = flow
        self.voice_keys = voice_keys
        self.hift = hift
        self.token_mel_ratio = token_mel_ratio
        self.device = torch.device(device)
        self.flow_dtype = flow_dtype
        self.seed = seed
        self.mel_cache_frames = mel_cache_frames
        self.source_cache_len = mel_cache_frames * hift.config.samples_per_frame
        self.speech_window = torch.hamming_window(
            2 * self.source_cache_len, periodic=False, dtype=torch.float64
        )
        self.speech_window = self.speech_window.to(self.device)
        self._streams: StreamStates[_StreamState] = StreamStates(stream_idle_timeout_s)

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int | None = 0,
        flow_graphs: FlowGraphConfig | None = None,
        stream_idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        voice_prefix_bytes: int = 0,
    ) -> Token2Wav:
        """`cosyvoice2.yaml`, `flow.pt` (in `dtype`) and `hift.pt` (fp32, as upstream) from a model directory.

        `flow_graphs` (CUDA only): capture the flow decoder's CUDA graphs now and replay them for every call
        that fits one; the HiFT then replays graphs of the mel lengths it has seen before. `voice_prefix_bytes`
        (0: off): streamed calls decode after their voice's flow prefix, made once per voice and kept within
        this many bytes (tritontts.cosyvoice2.flow.voice_decode; with `flow_graphs`, its graphs too)."""
        from tritontts.cosyvoice2.config import load_cosyvoice2_config
        from tritontts.cosyvoice2.flow import load_flow
        from tritontts.cosyvoice2.flow.voice_decode import use_voice_prefixes

        model_dir = Path(model_dir)
        config = load_cosyvoice2_config(model_dir / CONFIG_FILE)
        flow = load_flow(model_dir, config, device, dtype)
        if flow_graphs is not None:
            flow.use_cuda_graphs(flow_graphs)
        if voice_prefix_bytes > 0:
            use_voice_prefixes(flow, voice_prefix_bytes, flow_graphs)
        hift = load_hift(model_dir / HIFT_FILE, HiFTConfig.from_yaml_dict(config.hift), device)
        if flow_graphs is not None:
            hift.use_cuda_graphs()
        return cls(
            flow,
            hift,
            config.token_mel_ratio,
            device,
            dtype,
            seed,
            stream_idle_timeout_s=stream_idle_timeout_s,
            voice_keys=voice_prefix_bytes > 0,
        )

    def voice_prefixes(self) -> tuple[int, int]:
        """(bytes kept, prefixes made) of the flow's voice prefix cache; (0, 0) without one."""
        decoder = getattr(self.flow, "voice_decoder", None)
        if decoder is None:
            return 0, 0
        return decoder.store.nbytes, decoder.store.made

    def _generator(self) -> torch.Generator | None:
        if self.seed is None:
            return None
        return torch.Generator(device=self.device).manual_seed(self.seed)

    def _flow_request(self, call: Token2WavCall) -> dict[str, Any]:
        target = call.target_tokens
        if target.dim() != 2 or target.shape[0] != 1:
            raise ValueError(f"target_tokens must be [1, n], got {tuple(target.shape)}")
        streaming = call.stream_id is not None and not call.finalize
        request = flow_request(
            target,
            call.prompt_tokens,
            call.prompt_feat,
            call.embedding,
            streaming,
            call.finalize,
            self.device,
            self.flow_dtype,
        )
        if self.voice_keys:
            key = voice_key(call.prompt_tokens, call.prompt_feat, call.embedding)
            request["voice"] = (key, call.prompt_tokens.shape[1])
        return request

    def run_many(
        self, calls: Sequence[Token2WavCall], timer: StageTimer | None = None
    ) -> list[Tensor | ValueError]:
        """Each call's audio (or its ValueError), the flows of all of them decoded in batches where the flow
        can. Two calls of one stream run one after the other, in the order given. `timer` gets the stages
        "flow" and "vocoder", the GPU synchronized at each mark."""
        results: list[Tensor | ValueError | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        while pending:
            seen: set[str] = set()
            now, later = [], []
            for i in pending:
                stream_id = calls[i].stream_id
                (later if stream_id is not None and stream_id in seen else now).append(i)
                if stream_id is not None:
                    seen.add(stream_id)
            self._run_round([calls[i] for i in now], now, results, timer)
            pending = later
        return results

    def _run_round(
        self,
        calls: list[Token2WavCall],
        slots: list[int],
        results: list[Tensor | ValueError | None],
        timer: StageTimer | None,
    ) -> None:
        requests: list[dict[str, Any] | ValueError] = []
        for call in calls:
            try:
                requests.append(self._flow_request(call))
            except ValueError as err:
                requests.append(err)
        with torch.inference_mode():
            mels = iter(self.flow.inference_many([r for r in requests if not isinstance(r, ValueError)]))
            mark_on_device(timer, "flow", self.device)
            for call, slot, request in zip(calls, slots, requests):
                mel = request if isinstance(request, ValueError) else next(mels)
                if isinstance(mel, ValueError):
                    results[slot] = mel
                    continue
                mel = mel.to(self.hift.stft_window.device, next(self.hift.parameters()).dtype)
                try:
                    results[slot] = self._audio(call, mel)
                except ValueError as err:
                    results[slot] = err
            mark_on_device(timer, "vocoder", self.device)

    def _audio(self, call: Token2WavCall, mel: Tensor) -> Tensor:
        if call.stream_id is None:
            speech, _ = self.hift.inference(mel, generator=self._generator())
            return speech
        return self._stream_audio(call.stream_id, mel, call.token_offset, call.finalize)

    def _run_one(self, call: Token2WavCall) -> Tensor:
        result = self.run_many([call])[0]
        if isinstance(result, ValueError):
            raise result
        return result

    def offline(
        self, target_tokens: Tensor, prompt_tokens: Tensor, prompt_feat: Tensor, embedding: Tensor
    ) -> Tensor:
        """Target tokens `[1, n]` → audio `[1, 2 n * 480]` at 24 kHz (flow without streaming masks)."""
        return self._run_one(Token2WavCall(target_tokens, prompt_tokens, prompt_feat, embedding))

    def stream(
        self,
        stream_id: str,
        target_tokens: Tensor,
        prompt_tokens: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        token_offset: int,
        finalize: bool,
    ) -> Tensor:
        """Audio `[1, N]` for the target tokens so far, from `token_offset` on, less the withheld tail.

        The first call of a `stream_id` opens its state; the `finalize` call returns the tail and closes it.
        """
        call = Token2WavCall(
            target_tokens, prompt_tokens, prompt_feat, embedding, stream_id, token_offset, finalize
        )
        return self._run_one(call)

    def _stream_audio(self, stream_id: str, mel: Tensor, token_offset: int, finalize: bool) -> Tensor:
        state = self._streams.get(stream_id)
        if state is None:
            state = _StreamState(self._generator())
        mel = mel[:, :, token_offset * self.token_mel_ratio :]
        cache_source = None
        if state.mel is not None:
            mel = torch.cat([state.mel, mel], dim=2)
            cache_source = state.source
        if not finalize and mel.shape[2] <= self.mel_cache_frames:
            raise ValueError(
                f"stream {stream_id}: a chunk needs more than {self.mel_cache_frames} mel frames, got {mel.shape[2]}"
            )
        speech, source = self.hift.inference(mel, cache_source, state.generator)
        if state.speech is not None:
            speech = fade_in_out(speech, state.speech, self.speech_window)
        if finalize:
            self._streams.pop(stream_id)
            return speech
        state.mel = mel[:, :, -self.mel_cache_frames :]
        state.source = source[:, :, -self.source_cache_len :]
        state.speech = speech[:, -self.source_cache_len :]
        self._streams.put(stream_id, state)
        return speech[:, : -self.source_cache_len]

    def close(self, stream_id: str) -> None:
        """Drop a stream's state (a cancelled request); nothing happens for an unknown id."""
        self._streams.pop(stream_id)

    @property
    def open_streams(self) -> list[str]:
        """The streams whose state is kept (one unused for the idle timeout is dropped)."""
        return self._streams.ids()
