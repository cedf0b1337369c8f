"""The request tensors of our TTS models, reading their responses, and checking the server before a run.

Works with tritonclient's gRPC (sync) and HTTP clients: both have the same method names, the gRPC one
answers `as_json=True` requests with {"config": {...}}, the HTTP one with the config itself.
"""

from __future__ import annotations

import argparse
import math
from types import ModuleType

import numpy as np

from tritontts.dsp.resample import resample

REFERENCE_SAMPLE_RATE = 16000
OUTPUT_SAMPLE_RATES = {"spark_tts": 16000, "cosyvoice2": 24000, "cosyvoice3": 24000, "f5_tts": 24000}
# Speech tokens per second of audio, for --realistic-lengths.
TOKEN_RATES = {"spark_tts": 50, "cosyvoice2": 25, "cosyvoice3": 25}
# Seconds consecutive streamed chunks overlap: Spark-TTS's BLS sends overlapping chunks for the client to
# cross-fade (its audio_chunk_overlap_duration); CosyVoice2's token2wav cross-fades itself and CosyVoice3's BLS
# sends only new samples of a causal vocoder, so their chunks play back to back.
CHUNK_OVERLAP_SECONDS = {"spark_tts": 0.1, "cosyvoice2": 0.0, "cosyvoice3": 0.0}
INPUT_NAMES = ("reference_wav", "reference_wav_len", "reference_text", "target_text")
OUTPUT_NAME = "waveform"


class ServerCheckError(RuntimeError):
    """The server or model cannot serve this client; the message is one line saying why."""


def _known(model_name: str, table: dict) -> str | None:
    """The key of `table` that is `model_name` or the longest prefix of it followed by `_`."""
    for known in sorted(table, key=len, reverse=True):
        if model_name == known or model_name.startswith(known + "_"):
            return known
    return None


def output_sample_rate(model_name: str, override: int | None = None) -> int:
    """The rate of a known model, or of one deployed under a name that starts with a known name."""
    if override:
        return override
    known = _known(model_name, OUTPUT_SAMPLE_RATES)
    if known is None:
        raise ValueError(f"no known output sample rate for model '{model_name}': pass --sample-rate")
    return OUTPUT_SAMPLE_RATES[known]


def token_rate(model_name: str) -> int:
    """Speech tokens per second of a known model's audio (50 when unknown, Spark-TTS's rate)."""
    known = _known(model_name, TOKEN_RATES)
    return TOKEN_RATES[known] if known else TOKEN_RATES["spark_tts"]


def chunk_overlap_seconds(model_name: str, override: float | None = None) -> float:
    """How much a known model's streamed chunks overlap (0.1 s when unknown, as upstream's client)."""
    if override is not None:
        return override
    known = _known(model_name, CHUNK_OVERLAP_SECONDS)
    return CHUNK_OVERLAP_SECONDS[known] if known else 0.1


def true_or_false(text: str) -> bool:
    """A command-line boolean in upstream's spelling (`True`/`False`), any case."""
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def reference_samples(wav: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 samples at the 16 kHz the server expects."""
    wav = np.asarray(wav, dtype=np.float32)
    if wav.ndim == 2:
        wav = wav[:, 0]
    if sample_rate != REFERENCE_SAMPLE_RATE:
        wav = resample(wav, sample_rate, REFERENCE_SAMPLE_RATE)
    return np.ascontiguousarray(wav, dtype=np.float32)


def padded_length(samples: int, pad_seconds: float | None) -> int:
    """`samples` rounded up to whole multiples of `pad_seconds` (at 16 kHz), so that requests share shapes
    and batch together; the true length travels in `reference_wav_len`."""
    if not pad_seconds:
        return samples
    block = int(round(pad_seconds * REFERENCE_SAMPLE_RATE))
    return max(1, math.ceil(samples / block)) * block


def request_arrays(
    samples: np.ndarray, reference_text: str, target_text: str, pad_seconds: float | None = None
) -> dict[str, np.ndarray]:
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    wav = np.zeros((1, padded_length(samples.size, pad_seconds)), dtype=np.float32)
    wav[0, : samples.size] = samples
    return {
        "reference_wav": wav,
        "reference_wav_len": np.array([[samples.size]], dtype=np.int32),
        "reference_text": np.array([[reference_text.encode("utf-8")]], dtype=object),
        "target_text": np.array([[target_text.encode("utf-8")]], dtype=object),
    }


def target_only_arrays(target_text: str) -> dict[str, np.ndarray]:
    """A request without reference inputs: CosyVoice2 then speaks as its cached speaker (spk2info.pt)."""
    return {"target_text": np.array([[target_text.encode("utf-8")]], dtype=object)}


def infer_inputs(client_module: ModuleType, arrays: dict[str, np.ndarray]) -> list:
    """`InferInput`s of tritonclient.grpc or tritonclient.http (binary tensors over HTTP)."""
    is_http = client_module.__name__.endswith(".http")
    inputs = []
    for name, array in arrays.items():
        datatype = (
            "BYTES"
            if array.dtype == object
            else {np.float32: "FP32", np.int32: "INT32", np.bool_: "BOOL"}[array.dtype.type]
        )
        tensor = client_module.InferInput(name, list(array.shape), datatype)
        if is_http:
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def requested_outputs(client_module: ModuleType) -> list:
    if client_module.__name__.endswith(".http"):
        return [client_module.InferRequestedOutput(OUTPUT_NAME, binary_data=True)]
    return [client_module.InferRequestedOutput(OUTPUT_NAME)]


def waveform(result) -> np.ndarray:
    """The audio samples of one response; empty for a response without the output (a final flag only)."""
    array = result.as_numpy(OUTPUT_NAME)
    return np.zeros(0, dtype=np.float32) if array is None else np.asarray(array, dtype=np.float32).reshape(-1)


def is_final(result) -> bool:
    """Whether a gRPC stream response carries Triton's final-response flag."""
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]


def is_decoupled(config: dict) -> bool:
    config = config.get("config", config)
    return bool(config.get("model_transaction_policy", {}).get("decoupled", False))


def check_server(client, url: str, protocol: str, model_name: str, streaming: bool) -> dict:
    """The model's config, after checking the server is live, the model ready, and that its decoupled-ness
    matches the mode; otherwise a ServerCheckError with one line for the user."""
    try:
        live = client.is_server_live()
    except Exception as error:
        raise ServerCheckError(
            f"cannot reach Triton at {url} over {protocol}: {_first_line(error)}"
        ) from error
    if not live:
        raise ServerCheckError(f"Triton at {url} answers but is not live")
    try:
        ready = client.is_model_ready(model_name)
    except Exception:
        ready = False
    if not ready:
        raise ServerCheckError(f"model '{model_name}' is not ready on {url}{_available_models(client)}")
    try:
        config = client.get_model_config(model_name, **_json_kwargs(client))
    except Exception as error:
        raise ServerCheckError(
            f"cannot read the config of model '{model_name}': {_first_line(error)}"
        ) from error
    decoupled = is_decoupled(config)
    if streaming and not decoupled:
        raise ServerCheckError(
            f"model '{model_name}' is not decoupled, so it cannot stream: use --mode offline, or serve it decoupled"
        )
    if not streaming and decoupled:
        hint = (
            "HTTP cannot stream; use client_grpc.py --mode streaming"
            if protocol == "HTTP"
            else "use --mode streaming"
        )
        raise ServerCheckError(f"model '{model_name}' is decoupled (streaming): {hint}")
    return config


def _json_kwargs(client) -> dict:
    """gRPC clients return protobuf messages unless asked for JSON; HTTP clients always return JSON."""
    return {"as_json": True} if hasattr(client, "start_stream") else {}


def _available_models(client) -> str:
    try:
        index = client.get_model_repository_index(**_json_kwargs(client))
    except Exception:
        return ""
    models = index.get("models", []) if isinstance(index, dict) else index
    ready = sorted({m.get("name", "") for m in models if m.get("state", "READY") == "READY"})
    return f" (ready models: {', '.join(ready) or 'none'})"
