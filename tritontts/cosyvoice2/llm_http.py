"""CosyVoice2's LLM over HTTP: a streamed `/v1/chat/completions` request, as upstream's DiT BLS sends it to
trtllm-serve (or to `python -m tritontts.llm.openai_server`).

The user message is the reference text followed by the target text, the assistant message the reference's
speech tokens as `<|s_N|>` text, which the model continues. Speech tokens are read from the streamed
`delta.content` with upstream's regex and come out as LLM ids (N + 151663), like the tensorrt_llm path's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx
import numpy as np

from tritontts.cosyvoice2.prompt import check_speech_tokens
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.llm.sequence import SamplingParams

SPEECH_TOKEN = re.compile(r"<\|s_(\d+)\|>")
STOP_STRINGS = ("<|eos1|>", "<|eos|>")
UPSTREAM_MODEL_NAME = "trt_engines_bfloat16"
ERROR_BODY_CHARS = 500


@dataclass(frozen=True)
class ChatEndpoint:
    url: str
    """the full URL of `/v1/chat/completions`"""
    model: str = UPSTREAM_MODEL_NAME
    timeout: float | None = 300.0
    """seconds to wait for a connection or the next streamed bytes; None waits for ever"""


def speech_chat_payload(
    reference_text: str,
    target_text: str,
    prompt_speech_tokens: Sequence[int],
    sampling: SamplingParams,
    model: str = UPSTREAM_MODEL_NAME,
) -> dict:
    """Upstream's request body, plus `min_tokens` (our server's extension) and `seed` when one is set."""
    speech = "".join(f"<|s_{t}|>" for t in check_speech_tokens(prompt_speech_tokens))
    payload = {
        "model": model,
        "messages": [
            {"role": "user", "content": f"{reference_text}{target_text}"},
            {"role": "assistant", "content": speech},
        ],
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "repetition_penalty": sampling.repetition_penalty,
        "stop": list(STOP_STRINGS),
        "stream": True,
    }
    if sampling.min_tokens:
        payload["min_tokens"] = sampling.min_tokens
    if sampling.seed is not None:
        payload["seed"] = sampling.seed
    return payload


class SpeechTokenParser:
    """`<|s_N|>` tokens of streamed text pieces, as LLM ids; a token split across pieces waits for its end."""

    def __init__(self) -> None:
        self.buffer = ""

    def feed(self, text: str) -> list[int]:
        self.buffer += text
        ids, end = [], 0
        for match in SPEECH_TOKEN.finditer(self.buffer):
            ids.append(int(match.group(1)) + ORIGINAL_VOCAB_SIZE)
            end = match.end()
        self.buffer = self.buffer[end:]
        return ids


def delta_content(data: str) -> str:
    """The text of one SSE `data:` event of a chat completion stream ("" when it has none)."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError:
        return ""
    choices = event.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


class ChatSpeechClient:
    """One connection pool to the endpoint, shared by every request of a BLS instance (thread-safe)."""

    def __init__(self, endpoint: ChatEndpoint, http: httpx.Client | None = None) -> None:
        self.endpoint = endpoint
        self.http = http or httpx.Client(timeout=endpoint.timeout, limits=httpx.Limits(max_connections=None))

    def close(self) -> None:
        self.http.close()

    def generate(
        self,
        reference_text: str,
        target_text: str,
        prompt_speech_tokens: np.ndarray,
        sampling: SamplingParams,
        streaming: bool = True,
    ) -> Iterator[np.ndarray]:
        """int32 LLM ids as they arrive (streamed either way; `streaming` is the service's, unused here).

        Closing the generator closes the response, which cancels the request on the server.
        """
        payload = speech_chat_payload(
            reference_text, target_text, prompt_speech_tokens.tolist(), sampling, self.endpoint.model
        )
        url = self.endpoint.url
        parser = SpeechTokenParser()
        try:
            with self.http.stream("POST", url, json=payload) as response:
                if response.status_code != 200:
                    body = response.read().decode(errors="replace")[:ERROR_BODY_CHARS]
                    raise RuntimeError(f"LLM endpoint {url} answered HTTP {response.status_code}: {body}")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        break
                    ids = parser.feed(delta_content(data))
                    if ids:
                        yield np.asarray(ids, dtype=np.int32)
        except httpx.HTTPError as error:
            raise RuntimeError(f"LLM endpoint {url}: {type(error).__name__}: {error}") from error
