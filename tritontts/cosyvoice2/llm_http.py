"""CosyVoice2's LLM over HTTP: a streamed `/v1/chat/completions` request, as upstream's DiT BLS sends it to
trtllm-serve (or to `python -m tritontts.llm.openai_server`).

The user message is the reference text followed by the target text, the assistant message the reference's
speech tokens as `<|s_N|>` text, which the model continues. Speech tokens are read from the streamed
`delta.content` with upstream's regex and come out as LLM ids (N + 151663), like the tensorrt_llm path's.

Bistream's segment requests (tritontts.cosyvoice2.bistream) go to `/v1/completions` beside the chat URL: a
token-id prompt, the segment's end id as the one stop (`stop` as its token text, `stop_token_ids` too),
`ignore_eos`, `logit_bias` -100 for its bad ids, streamed (SSE) so that a long final segment is spoken as it comes.
There the text must be `<|s_N|>` tokens and nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np

from tritontts.cosyvoice2.prompt import check_speech_tokens
from tritontts.cosyvoice2.tokens import ORIGINAL_VOCAB_SIZE
from tritontts.llm.sequence import SamplingParams

SPEECH_TOKEN = re.compile(r"<\|s_(\d+)\|>")
SPEECH_TOKEN_START = re.compile(r"<(\|(s(_(\d+(\|)?)?)?)?)?")
"""a text that may become a speech token with more pieces"""
CHAT_PATH = "/chat/completions"
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
    param: str = "llm_endpoint"
    """the model parameter that set `url` (errors name it)"""

    @property
    def completions_url(self) -> str:
        """`/v1/completions` of the same server: the chat URL with `/chat/completions` → `/completions`."""
        parts = urlsplit(self.url)
        path = parts.path.rstrip("/")
        if not path.endswith(CHAT_PATH):
            raise RuntimeError(
                f"{self.param}: {self.url} does not end in {CHAT_PATH}, so its /v1/completions is unknown"
            )
        return urlunsplit(parts._replace(path=path.removesuffix(CHAT_PATH) + "/completions"))


def sampling_fields(sampling: SamplingParams) -> dict:
    """The request body's decoding fields, plus `min_tokens` (our server's extension) and `seed` when set."""
    fields = {
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "repetition_penalty": sampling.repetition_penalty,
    }
    if sampling.min_tokens:
        fields["min_tokens"] = sampling.min_tokens
    if sampling.seed is not None:
        fields["seed"] = sampling.seed
    return fields


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
        **sampling_fields(sampling),
        "stop": list(STOP_STRINGS),
        "stream": True,
    }
    return payload


def speech_completion_payload(
    prompt_ids: Sequence[int], sampling: SamplingParams, stop: str, model: str = UPSTREAM_MODEL_NAME
) -> dict:
    """A bistream segment as a streamed `/v1/completions` body: `sampling`'s end id (`stop`: its token text)
    ends it, its bad token ids are banned, the model's own eos ids do not stop it."""
    if sampling.end_id is None:
        raise ValueError("a segment request needs an end id")
    payload = {
        "model": model,
        "prompt": [int(t) for t in prompt_ids],
        **sampling_fields(sampling),
        "stop": [stop],
        "stop_token_ids": [int(sampling.end_id)],
        "ignore_eos": True,
        "logit_bias": {str(int(t)): -100 for t in sampling.bad_token_ids},
        "stream": True,
    }
    return payload


class StrictSpeechParser:
    """`<|s_N|>` tokens of streamed text pieces as `speech_base + N`, to the stop text if a server sends it
    (`stopped`); any other text is a ValueError."""

    def __init__(self, speech_base: int, stop: str) -> None:
        self.speech_base = speech_base
        self.stop = stop
        self.buffer = ""
        self.stopped = False

    def feed(self, text: str) -> list[int]:
        self.buffer += text
        ids, end = [], 0
        while match := SPEECH_TOKEN.match(self.buffer, end):
            ids.append(self.speech_base + int(match.group(1)))
            end = match.end()
        self.buffer = self.buffer[end:]
        if self.stop and self.buffer.startswith(self.stop):
            self.stopped, self.buffer = True, ""
        elif self.buffer and not (
            SPEECH_TOKEN_START.fullmatch(self.buffer) or self.stop.startswith(self.buffer)
        ):
            raise ValueError(f"the completion holds text that is not <|s_N|> tokens: {self.buffer[:60]!r}")
        return ids

    def end(self) -> None:
        if self.buffer:
            raise ValueError(f"the completion ends inside a token: {self.buffer!r}")


def completion_text(data: str) -> str:
    """The text of one SSE `data:` event of a completion stream; ValueError for an error event or a bad one."""
    try:
        event = json.loads(data)
    except json.JSONDecodeError as error:
        raise ValueError(f"an event that is not JSON: {data[:ERROR_BODY_CHARS]!r}") from error
    if not isinstance(event, dict):
        raise ValueError(f"an event that is not a JSON object: {data[:ERROR_BODY_CHARS]!r}")
    if "error" in event:
        raise ValueError(f"an error event: {json.dumps(event['error'])[:ERROR_BODY_CHARS]}")
    choices = event.get("choices")
    if choices == []:  # a usage-only event
        return ""
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise ValueError(f"an event without choices: {data[:ERROR_BODY_CHARS]!r}")
    text = choices[0].get("text")
    if not isinstance(text, str | None):
        raise ValueError(f"an event whose text is not a string: {data[:ERROR_BODY_CHARS]!r}")
    return text or ""


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
        parser = SpeechTokenParser()
        with closing(self._events(self.endpoint.url, payload, f"LLM endpoint {self.endpoint.url}")) as events:
            for data in events:
                ids = parser.feed(delta_content(data))
                if ids:
                    yield np.asarray(ids, dtype=np.int32)

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingParams, stop: str, speech_base: int
    ) -> Iterator[int]:
        """One bistream segment over `/v1/completions`: the generated speech tokens as LLM ids
        (`speech_base + N`), streamed; the end id is not among them (the stop ends the stream). Errors name
        the endpoint's parameter and the URL. Closing the generator closes the response (cancels the request)."""
        url = self.endpoint.completions_url
        where = f"{self.endpoint.param}: LLM endpoint {url}"
        payload = speech_completion_payload(prompt_ids, sampling, stop, self.endpoint.model)
        parser = StrictSpeechParser(speech_base, stop)
        try:
            with closing(self._events(url, payload, where)) as events:
                for data in events:
                    yield from parser.feed(completion_text(data))
                    if parser.stopped:
                        return
            parser.end()
        except ValueError as error:
            raise RuntimeError(f"{where}: {error}") from error

    def _events(self, url: str, payload: dict, where: str) -> Iterator[str]:
        """The `data:` payloads of a streamed POST, to `[DONE]`; HTTP failures are RuntimeErrors after `where`."""
        try:
            with self.http.stream("POST", url, json=payload) as response:
                if response.status_code != 200:
                    body = response.read().decode(errors="replace")[:ERROR_BODY_CHARS]
                    raise RuntimeError(f"{where} answered HTTP {response.status_code}: {body}")
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:") :].strip()
                    if data == "[DONE]":
                        return
                    yield data
        except httpx.HTTPError as error:
            raise RuntimeError(f"{where}: {type(error).__name__}: {error}") from error
