"""From a speech request's voice fields to the Triton inputs and parameters of its BLS.

Voices: a saved voice (`voice: NAME` or `{"id": NAME}`; its profile when one was made with this deployment's
family), a per-request reference (`ref_audio`, optional `ref_text`), or Spark-TTS voice creation
(`voice: {"gender", "pitch", "speed"}`). Modes, as the BLS names them (`voice_modes` of its config):

- clone: the reference and its transcript; without a transcript Spark-TTS uses its global tokens only and
  CosyVoice2 speaks cross-lingually (upstream's `inference_cross_lingual`);
- create (Spark-TTS): gender, pitch level, speed level; OpenAI's `speed` picks the level (speech.SPEED_LEVELS);
- instruct2 (CosyVoice2): `instructions` become the LLM's instruction text, ended by `<|endofprompt|>` as
  upstream's examples write it; the reference (or the deployment's cached speaker) still gives the timbre.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field

import numpy as np

from tritontts.bench import triton_io
from tritontts.cosyvoice2.prompt import ENDOFPROMPT
from tritontts.openai_api.errors import bad_request
from tritontts.openai_api.speech import SpeechRequest, speed_level
from tritontts.openai_api.triton_client import Deployment
from tritontts.openai_api.voices import Voice, VoiceStore
from tritontts.voice_profile import NEEDS_REFERENCE_AUDIO, VoiceProfile


@dataclass(frozen=True)
class VoiceChoice:
    """The checked voice fields: what speaks, before any file is read."""

    mode: str  # clone, create, instruct2
    saved: str | None = None
    reference: bytes | None = None
    reference_text: str | None = None
    control: dict[str, str] = field(default_factory=dict)
    instruct_text: str | None = None


@dataclass(frozen=True)
class TritonVoice:
    """The BLS request's inputs and parameters, and the saved voice whose profile they carry (if any)."""

    arrays: dict[str, np.ndarray]
    parameters: dict
    saved: Voice | None = None
    profile: VoiceProfile | None = None


def _text(value: str) -> np.ndarray:
    return np.array([[value.encode("utf-8")]], dtype=object)


def decode_ref_audio(value: str | bytes) -> bytes:
    """`ref_audio`'s bytes: a file part as it is, else base64 (bare or in a data URI); no URLs, no paths."""
    if isinstance(value, bytes):
        return value
    text = value.strip()
    if text.startswith(("http://", "https://", "file:", "/")):
        raise bad_request(
            "ref_audio must be base64 audio (or a data: URI, or a multipart file part); "
            "this server fetches no URLs and reads no paths",
            "ref_audio",
        )
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise bad_request(
                "ref_audio: a data: URI must be base64 (data:audio/wav;base64,...)", "ref_audio"
            )
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise bad_request(f"ref_audio is not valid base64: {err}", "ref_audio") from None


def choose_voice(request: SpeechRequest, deployment: Deployment) -> VoiceChoice:
    """The mode and voice source of a request on this deployment; a 400 naming the field otherwise."""
    model, modes = deployment.route.name, deployment.modes
    instructions = (request.instructions or "").strip() or None
    design, name = request.design, request.voice_name
    task = request.task_type
    if task == "VoiceDesign" and design is None:
        raise bad_request('task_type VoiceDesign needs voice {"gender", "pitch", "speed"}', "voice")
    if design is not None and task not in (None, "VoiceDesign"):
        raise bad_request(f"a voice object (voice creation) does not go with task_type {task}", "task_type")
    if task == "CustomVoice" and name is None:
        raise bad_request("task_type CustomVoice needs a saved voice's name in voice", "voice")
    if request.ref_audio is not None and (name is not None or design is not None):
        raise bad_request("send either voice or ref_audio, not both", "ref_audio")
    if request.ref_audio is None and request.ref_text is not None:
        raise bad_request("ref_text is the transcript of ref_audio, which is missing", "ref_text")
    if name is None and design is None and request.ref_audio is None:
        raise bad_request(
            "voice is required (a saved voice's name, or a voice object for voice creation), or ref_audio",
            "voice",
            "missing_required_parameter",
        )
    if instructions is not None and "instruct2" not in modes:
        raise bad_request(
            f"model '{model}' has no instruct mode (CosyVoice2 models follow instructions)",
            "instructions",
            "unsupported_value",
        )
    if design is not None:
        if "create" not in modes:
            raise bad_request(
                f"model '{model}' cannot create a voice from attributes (Spark-TTS models can)",
                "voice",
                "unsupported_value",
            )
        if design.speed is not None and request.speed != 1.0:
            raise bad_request("give the speed either as voice.speed (a level) or as speed, not both", "speed")
        control = {"gender": design.gender, "pitch": design.pitch or "moderate"}
        control["speed"] = design.speed or speed_level(request.speed)
        return VoiceChoice("create", control=control)
    if request.speed != 1.0:
        raise bad_request(
            f"speed {request.speed} is not supported here: a cloned voice speaks at its own pace (speed 1.0); "
            "Spark-TTS voice creation maps speed to its speed levels",
            "speed",
            "unsupported_value",
        )
    reference = None if request.ref_audio is None else decode_ref_audio(request.ref_audio)
    if instructions is not None:
        instruct = instructions if instructions.endswith(ENDOFPROMPT) else instructions + ENDOFPROMPT
        return VoiceChoice("instruct2", name, reference, instruct_text=instruct)
    return VoiceChoice("clone", name, reference, reference_text=request.ref_text)


def _reference_arrays(samples: np.ndarray) -> dict[str, np.ndarray]:
    arrays = triton_io.request_arrays(samples, "", "")
    return {k: arrays[k] for k in ("reference_wav", "reference_wav_len")}


def triton_voice(
    choice: VoiceChoice,
    deployment: Deployment,
    voices: VoiceStore,
    target_text: str,
    use_profile: bool = True,
) -> TritonVoice:
    """The BLS inputs for `choice` (blocking: reads the voice's files)."""
    arrays = {"target_text": _text(target_text)}
    if choice.mode == "create":
        return TritonVoice(arrays | {k: _text(v) for k, v in choice.control.items()}, {})
    saved = samples = None
    transcript = choice.reference_text
    if choice.saved is not None:
        saved = voices.get(choice.saved)
        samples, transcript = saved.samples, saved.transcript
    elif choice.reference is not None:
        samples = voices.reference(choice.reference, "ref_audio")[0]
        transcript = voices.check_transcript(transcript, "ref_text", required=False)
    parameters: dict = {}
    if choice.mode == "instruct2":
        arrays["instruct_text"] = _text(choice.instruct_text or "")
        parameters["mode"] = "instruct2"
    elif "cross_lingual" in deployment.modes and not transcript:
        parameters["mode"] = "cross_lingual"  # CosyVoice2 without a transcript: upstream's cross-lingual
    elif "create" in deployment.modes or transcript:
        arrays["reference_text"] = _text(transcript or "")
    else:
        raise bad_request(
            f"model '{deployment.route.name}' needs the reference's transcript (ref_text)", "ref_text"
        )
    kind = deployment.profile_kind
    profile = voices.profile(saved.name, kind) if saved is not None and kind and use_profile else None
    if profile is not None:
        arrays |= profile.request_arrays()
        if kind in NEEDS_REFERENCE_AUDIO:
            arrays |= _reference_arrays(samples)
    elif samples is not None:
        arrays |= _reference_arrays(samples)
    return TritonVoice(arrays, parameters, saved, profile)


def profile_request(samples: np.ndarray) -> dict[str, np.ndarray]:
    """A `voice_profile` request's inputs for a reference."""
    return _reference_arrays(samples) | {"target_text": _text("-")}
