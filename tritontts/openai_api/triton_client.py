"""Calls into Triton over gRPC (asyncio): one request, or one decoupled stream, per speech request.

Which of a route's Triton models streams is read from its config (decoupled or not) and kept a few seconds.
Non-streaming requests use the non-decoupled model, or collect the decoupled model's stream when only that one
is deployed; streaming requests need a decoupled model. The decoupled model's chunks overlap by its
`audio_chunk_overlap_duration` parameter and are cross-faded here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
from tritonclient.utils import InferenceServerException

from tritontts.bench import triton_io
from tritontts.openai_api.errors import SERVER_ERROR, ApiError, bad_request, overloaded, unavailable
from tritontts.openai_api.settings import ModelRoute
from tritontts.streaming import StreamCrossfader
from tritontts.voice_profile import KIND_ARRAYS, OUTPUT_PREFIX, PROFILE_PARAMETER, VoiceProfile

REQUEST_FIELDS = {
    "target_text": "input",
    "reference_text": "voice",
    "reference_wav": "voice",
    "reference_wav_len": "voice",
    "instruct_text": "instructions",
    "mode": "instructions",
    "gender": "voice",
    "pitch": "voice",
    "speed": "speed",
    "voice_checkpoint": "voice",
    "text_normalization": "text_normalization",
}
DEFAULT_MAX_TEXT_LENGTH = 1000
"""a BLS whose config names no `max_text_length` (upstream's): our BLS's default"""
CLONE_ONLY = frozenset({"clone"})
"""A BLS whose config names no `voice_modes` (upstream's, an older one): reference audio voices only."""


@dataclass(frozen=True)
class Deployment:
    """What a route has on the server now."""

    route: ModelRoute
    streaming_model: str | None
    offline_model: str | None
    overlap_samples: int = 0
    modes: frozenset[str] = CLONE_ONLY
    """the BLS's `voice_modes` parameter: clone, create (Spark-TTS), cross_lingual, instruct2 (CosyVoice2)"""
    profile_kind: str | None = None
    """the BLS's `voice_profile_kind` parameter; None: it takes no saved voice profiles"""
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH
    """the BLS's `max_text_length` parameter (the smallest of the route's models): the longest text segment the
    API sends in one request"""
    text_inbox: str | None = None
    """the streaming BLS's `text_inbox_model` parameter: it takes bistream requests, their text through that
    model (docs/streaming-text.md, "Bistream"); None: no bistream"""


@dataclass(frozen=True)
class _ModelInfo:
    decoupled: bool
    overlap_seconds: float
    checked_at: float
    modes: frozenset[str] = CLONE_ONLY
    profile_kind: str | None = None
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH
    text_inbox: str | None = None


def _parameter(config: dict, key: str) -> str:
    return ((config.get("parameters") or {}).get(key) or {}).get("string_value") or ""


def _max_text_length(config: dict) -> int:
    value = _parameter(config, "max_text_length")
    return int(value) if value.isdigit() and int(value) > 0 else DEFAULT_MAX_TEXT_LENGTH


OVERLOAD_MESSAGES = ("Exceeds maximum queue size", "Request timeout expired")
STUB_DIED_MESSAGES = (
    "is not healthy",
    "stub process died",
)  # the watchdog reloads the model (docs/reliability.md)


def triton_error(error: InferenceServerException, retry_after_s: int = 2) -> ApiError:
    """A Triton error as the API's: the BLS's request checks (INVALID_ARGUMENT, or a stream error naming an
    input) are the caller's 400; a full queue or a queue timeout 503 with Retry-After; an unreachable server or
    missing model 503; anything else 500."""
    message = error.message() or str(error)
    status = str(error.status() or "")
    field = message.split(":", 1)[0].strip()
    if any(m in message for m in OVERLOAD_MESSAGES):
        return overloaded(f"Triton is overloaded: {message}", retry_after_s)
    if "INVALID_ARGUMENT" in status or (not status and field in REQUEST_FIELDS):
        return bad_request(
            f"Triton rejected the request: {message}", REQUEST_FIELDS.get(field), "triton_invalid_argument"
        )
    if any(m in message for m in STUB_DIED_MESSAGES) or any(
        s in status for s in ("UNAVAILABLE", "NOT_FOUND", "DEADLINE_EXCEEDED", "CANCELLED")
    ):
        return unavailable(f"Triton is not available: {message}", retry_after_s)
    return ApiError(500, f"Triton failed: {message}", code="triton_error", type=SERVER_ERROR)


class TritonTTS:
    def __init__(
        self,
        url: str,
        request_timeout_s: float = 600.0,
        config_ttl_s: float = 5.0,
        max_new_tokens: int | None = None,
        queue_timeout_s: float = 0.0,
        retry_after_s: int = 2,
    ) -> None:
        self.url = url
        self.queue_timeout_us = int(queue_timeout_s * 1e6) or None
        self.retry_after_s = retry_after_s
        self.parameters = None if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
        self.request_timeout_s = request_timeout_s
        self.config_ttl_s = config_ttl_s
        self._client: grpc_aio.InferenceServerClient | None = None
        self._models: dict[str, _ModelInfo | None] = {}

    @property
    def client(self) -> grpc_aio.InferenceServerClient:
        if self._client is None:  # created inside the running event loop
            self._client = grpc_aio.InferenceServerClient(self.url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def server_live(self) -> bool:
        try:
            return bool(await self.client.is_server_live(client_timeout=5.0))
        except InferenceServerException:
            return False

    async def server_ready(self) -> bool:
        """Triton's own readiness: false while any model it holds is not ready, ours or not (strict readiness:
        a model whose load failed keeps it false), so the API's health asks `server_live` and its routes."""
        try:
            return bool(await self.client.is_server_ready(client_timeout=5.0))
        except InferenceServerException:
            return False

    async def _model(self, name: str) -> _ModelInfo | None:
        known = self._models.get(name)
        if known is not None and time.monotonic() - known.checked_at < self.config_ttl_s:
            return known
        try:
            if not await self.client.is_model_ready(name, client_timeout=5.0):
                self._models[name] = None
                return None
            config = (await self.client.get_model_config(name, as_json=True, client_timeout=5.0))["config"]
        except InferenceServerException as err:
            if "UNAVAILABLE" in str(err.status()) or "DEADLINE" in str(err.status()):
                raise unavailable(f"cannot reach Triton at {self.url}: {err.message()}") from None
            self._models[name] = None
            return None
        overlap = _parameter(config, "audio_chunk_overlap_duration") or "0"
        modes = frozenset(m.strip() for m in _parameter(config, "voice_modes").split(",") if m.strip())
        kind = _parameter(config, "voice_profile_kind")
        info = _ModelInfo(
            triton_io.is_decoupled(config),
            float(overlap or 0),
            time.monotonic(),
            modes or CLONE_ONLY,
            kind if kind in KIND_ARRAYS else None,
            _max_text_length(config),
            _parameter(config, "text_inbox_model") or None,
        )
        self._models[name] = info
        return info

    async def deployment(self, route: ModelRoute) -> Deployment:
        """The route's ready models by role; 503 when none of them is ready."""
        infos = await asyncio.gather(*(self._model(name) for name in route.triton_models))
        streaming = next((n for n, i in zip(route.triton_models, infos) if i and i.decoupled), None)
        offline = next((n for n, i in zip(route.triton_models, infos) if i and not i.decoupled), None)
        if streaming is None and offline is None:
            raise unavailable(f"none of {', '.join(route.triton_models)} is ready on Triton at {self.url}")
        overlap, inbox = 0, None
        if streaming is not None:
            info = infos[route.triton_models.index(streaming)]
            overlap = int(round(info.overlap_seconds * route.sample_rate))
            inbox = info.text_inbox
        info = next(i for i in infos if i)
        max_text_length = min(i.max_text_length for i in infos if i)
        return Deployment(
            route, streaming, offline, overlap, info.modes, info.profile_kind, max_text_length, inbox
        )

    def _request(
        self, model: str, arrays: dict[str, np.ndarray], parameters: dict | None, outputs: list | None = None
    ) -> dict:
        merged = {**(self.parameters or {}), **(parameters or {})}
        return {
            "model_name": model,
            "inputs": triton_io.infer_inputs(grpcclient, arrays),
            "outputs": outputs or triton_io.requested_outputs(grpcclient),
            "request_id": uuid.uuid4().hex,
            "parameters": merged or None,
            "timeout": self.queue_timeout_us,
        }

    async def push_text(self, deployment: Deployment, session: str, text: str, final: bool) -> None:
        """One push to a running bistream request's text inbox (the deployment's `text_inbox` model)."""
        arrays = {
            "session_id": np.array([session.encode()], dtype=object),
            "text": np.array([text.encode("utf-8")], dtype=object),
            "final": np.array([final], dtype=np.bool_),
        }
        model = deployment.text_inbox or "text_inbox"
        inputs = triton_io.infer_inputs(grpcclient, arrays)
        try:
            await self.client.infer(model, inputs, client_timeout=self.request_timeout_s)
        except InferenceServerException as err:
            raise triton_error(err, self.retry_after_s) from None

    async def profile(self, deployment: Deployment, arrays: dict[str, np.ndarray]) -> VoiceProfile:
        """The BLS's profile of the reference in `arrays` (a `voice_profile` request; the offline model if any)."""
        kind = deployment.profile_kind
        if kind is None:
            raise bad_request(f"model '{deployment.route.name}' takes no voice profiles", "voice")
        names = [OUTPUT_PREFIX + n for n in KIND_ARRAYS[kind]] + ["profile_checkpoint"]
        outputs = [grpcclient.InferRequestedOutput(n) for n in names]
        request = self._request(
            deployment.offline_model or deployment.streaming_model, arrays, {PROFILE_PARAMETER: True}, outputs
        )
        try:
            if deployment.offline_model is not None:
                result = await self.client.infer(**request, client_timeout=self.request_timeout_s)
            else:
                result = await self._first_stream_result(request)
        except InferenceServerException as err:
            raise triton_error(err, self.retry_after_s) from None
        return VoiceProfile.from_outputs(kind, {n: result.as_numpy(n) for n in names})

    async def _first_stream_result(self, request: dict):
        async def one_request():
            yield request

        responses = self.client.stream_infer(one_request(), stream_timeout=self.request_timeout_s)
        try:
            async for result, error in responses:
                if error is not None:
                    raise error
                return result
        finally:
            responses.cancel()
        raise InferenceServerException("the stream ended without a response")

    async def synthesize(
        self, deployment: Deployment, arrays: dict[str, np.ndarray], parameters: dict | None = None
    ) -> np.ndarray:
        """The whole utterance: the offline model, else the decoupled model's stream joined."""
        if deployment.offline_model is None:
            crossfader = StreamCrossfader(deployment.overlap_samples)
            pieces = [crossfader.push(chunk) async for chunk in self.stream(deployment, arrays, parameters)]
            return np.concatenate([*pieces, crossfader.finish()])
        request = self._request(deployment.offline_model, arrays, parameters)
        try:
            result = await self.client.infer(**request, client_timeout=self.request_timeout_s)
        except InferenceServerException as err:
            raise triton_error(err, self.retry_after_s) from None
        return triton_io.waveform(result)

    async def stream(
        self,
        deployment: Deployment,
        arrays: dict[str, np.ndarray],
        parameters: dict | None = None,
        keep_empty: bool = False,
    ) -> AsyncIterator[np.ndarray]:
        """The decoupled model's chunks as they come (overlapping; see StreamCrossfader), empty ones too with
        `keep_empty` (a bistream request's first response). Closing the iterator early cancels the Triton
        request."""
        if deployment.streaming_model is None:
            raise bad_request(
                f"model '{deployment.route.name}' has no streaming (decoupled) model on Triton; "
                "leave stream_format out for the whole file",
                "stream_format",
                "streaming_unavailable",
            )
        request = self._request(deployment.streaming_model, arrays, parameters)

        async def one_request():
            yield request

        try:
            responses = self.client.stream_infer(one_request(), stream_timeout=self.request_timeout_s)
        except InferenceServerException as err:
            raise triton_error(err, self.retry_after_s) from None
        try:
            async for result, error in responses:
                if error is not None:
                    raise triton_error(error, self.retry_after_s)
                chunk = triton_io.waveform(result)
                if chunk.size or keep_empty:
                    yield chunk
        except InferenceServerException as err:
            raise triton_error(err, self.retry_after_s) from None
        except grpc.RpcError as err:
            raise triton_error(
                InferenceServerException(err.details(), str(err.code())), self.retry_after_s
            ) from None
        finally:
            responses.cancel()
