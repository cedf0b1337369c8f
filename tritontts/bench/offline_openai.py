"""The `openai` backend of offline_inference (alias `trtllm-serve`): CosyVoice2's LLM behind an OpenAI-compatible
`/v1/chat/completions` (trtllm-serve in production, `python -m tritontts.llm.openai_server` here).

Each row is one non-streamed request with upstream's body (the reference and target text as the user message,
the reference's speech tokens as `<|s_N|>` text in the assistant message that the model continues, stop at
`<|eos1|>` / `<|eos|>`); a batch's requests are in flight together. The reply's `<|s_N|>` tokens come back as
LLM ids (N + the id of `<|s_0|>`), like the in-process backends' output. With a forced count, `min_tokens` and
`max_tokens` are both that count; every request carries its seed.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import httpx

from tritontts.bench.offline_cosyvoice2_prompt import SpeechPrompt
from tritontts.bench.offline_llm import RequestSeeds
from tritontts.bench.offline_settings import BackendUnavailable, Decoding, LLMEndpointError
from tritontts.cosyvoice2.llm_http import ERROR_BODY_CHARS, SPEECH_TOKEN, speech_chat_payload
from tritontts.llm.sequence import SamplingParams

CHAT_PATH = "/v1/chat/completions"
REQUEST_TIMEOUT_S = 600.0
PROBE_TIMEOUT_S = 10.0


def chat_completions_url(url: str) -> str:
    """The full chat URL: a bare server address (`http://host:8000`) or its `/v1` gets `/v1/chat/completions`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"--llm-endpoint must be an http(s) URL such as http://localhost:8000{CHAT_PATH}, got {url!r}"
        )
    path = parts.path.rstrip("/")
    if path in ("", "/v1"):
        path = CHAT_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def speech_ids(content: str, speech_base: int) -> list[int]:
    """The `<|s_N|>` tokens of a reply's text, as LLM ids."""
    return [int(n) + speech_base for n in SPEECH_TOKEN.findall(content)]


class ChatSpeechBackend:
    """Prompts in, per prompt the generated speech ids; one connection pool, one thread per request in flight."""

    def __init__(
        self,
        url: str,
        model: str,
        decoding: Decoding,
        max_new_tokens: int,
        seed: int,
        speech_base: int,
        concurrency: int,
    ) -> None:
        self.url = chat_completions_url(url)
        self.model = model
        self.decoding = decoding
        self.max_new_tokens = max_new_tokens
        self.seeds = RequestSeeds(seed)
        self.speech_base = speech_base
        self.http = httpx.Client(timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_connections=None))
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="llm-request")

    def close(self) -> None:
        self.pool.shutdown()
        self.http.close()

    def _unreachable(self, error: httpx.TransportError) -> BackendUnavailable:
        return BackendUnavailable(
            f"cannot reach the LLM endpoint {self.url} ({type(error).__name__}: {error}); start the server "
            "(trtllm-serve, or python -m tritontts.llm.openai_server) or fix --llm-endpoint"
        )

    def check_reachable(self) -> None:
        """Fails early when nothing answers at the endpoint's address (any HTTP answer will do)."""
        parts = urlsplit(self.url)
        models = urlunsplit((parts.scheme, parts.netloc, "/v1/models", "", ""))
        try:
            self.http.get(models, timeout=PROBE_TIMEOUT_S)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error

    def _payload(self, prompt: SpeechPrompt, forced: int | None, seed: int) -> dict:
        d = self.decoding
        sampling = SamplingParams(
            max_tokens=forced or self.max_new_tokens,
            min_tokens=forced or 0,
            temperature=d.temperature,
            top_k=d.top_k,
            top_p=d.top_p,
            repetition_penalty=d.repetition_penalty,
            seed=seed,
        )
        payload = speech_chat_payload(
            prompt.reference_text, prompt.target_text, prompt.speech_tokens.tolist(), sampling, self.model
        )
        return payload | {"stream": False}

    def _request(self, payload: dict, forced: int | None) -> list[int]:
        try:
            response = self.http.post(self.url, json=payload)
        except httpx.TransportError as error:
            raise self._unreachable(error) from error
        if response.status_code != 200:
            body = response.text[:ERROR_BODY_CHARS]
            raise LLMEndpointError(f"LLM endpoint {self.url} answered HTTP {response.status_code}: {body}")
        try:
            content = response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as error:
            body = response.text[:ERROR_BODY_CHARS]
            raise LLMEndpointError(f"LLM endpoint {self.url}: not a chat completion: {body}") from error
        ids = speech_ids(content, self.speech_base)
        return ids[:forced] if forced is not None else ids

    def __call__(self, prompts: Sequence[SpeechPrompt], forced: Sequence[int | None]) -> list[list[int]]:
        seeds = self.seeds.take(len(prompts))
        payloads = [self._payload(p, n, s) for p, n, s in zip(prompts, forced, seeds, strict=True)]
        return list(self.pool.map(self._request, payloads, forced))
