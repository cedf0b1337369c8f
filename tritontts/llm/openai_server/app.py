"""The FastAPI app: /v1/models, /health, /v1/completions and /v1/chat/completions (whole or SSE) over LLMEngine."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from jinja2.exceptions import TemplateError
from starlette.background import BackgroundTask
from tokenizers import Tokenizer

from tritontts.json_body import parse_json_object
from tritontts.llm.engine import LLMEngine
from tritontts.llm.openai_server.chat_template import ChatTemplate
from tritontts.llm.openai_server.detokenize import TextStream
from tritontts.llm.openai_server.generation import EngineStream, GenerationError
from tritontts.llm.openai_server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from tritontts.llm.sequence import SamplingParams
from tritontts.openai_api.errors import SERVER_ERROR, ApiError, bad_request, install_error_handlers, validated
from tritontts.spark.prompt import load_llm_tokenizer


@dataclass
class ServedModel:
    """The engine and what turns requests into its inputs."""

    engine: LLMEngine
    tokenizer: Tokenizer
    name: str
    chat_template: ChatTemplate | None = None
    eos_ids: tuple[int, ...] = ()
    request_ids: itertools.count = field(default_factory=itertools.count)

    @classmethod
    def from_model_dir(cls, engine: LLMEngine, model_dir: str | Path, name: str | None = None) -> ServedModel:
        model_dir = Path(model_dir)
        return cls(
            engine,
            load_llm_tokenizer(model_dir),
            name or model_dir.name,
            ChatTemplate.from_model_dir(model_dir),
            default_eos_ids(model_dir),
        )

    def stop_ids_and_strings(self, request: SamplingFields) -> tuple[list[int], list[str]]:
        """Stop strings that are one token become ids (after the request's, the model's eos ids)."""
        ids: list[int] = []
        strings: list[str] = []
        for text in request.stop_strings():
            token_id = self.tokenizer.token_to_id(text)
            if token_id is None:
                encoded = self.tokenizer.encode(text, add_special_tokens=False).ids
                token_id = encoded[0] if len(encoded) == 1 else None
            if token_id is None:
                strings.append(text)
            elif token_id not in ids:
                ids.append(token_id)
        if not request.ignore_eos:
            ids += [i for i in self.eos_ids if i not in ids]
        return ids, strings


def default_eos_ids(model_dir: Path) -> tuple[int, ...]:
    """`eos_token_id` of generation_config.json, else of config.json (an int or a list)."""
    for name in ("generation_config.json", "config.json"):
        path = model_dir / name
        if path.is_file():
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            if eos is not None:
                return tuple(eos) if isinstance(eos, list) else (eos,)
    return ()


def sampling_params(request: SamplingFields, stop_ids: list[int], max_tokens: int) -> SamplingParams:
    try:
        banned = request.banned_ids()
    except ValueError as error:
        raise bad_request(str(error), "logit_bias") from error
    try:
        return SamplingParams(
            max_tokens=request.token_limit() or max_tokens,
            min_tokens=request.min_tokens,
            temperature=request.temperature,
            top_k=max(request.top_k, 0),
            top_p=request.top_p,
            repetition_penalty=request.repetition_penalty,
            seed=request.seed,
            end_id=stop_ids[0] if stop_ids else None,
            bad_token_ids=banned,
        )
    except ValueError as error:
        raise bad_request(str(error)) from error


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"


T = TypeVar("T")
DISCONNECT_POLL_S = 0.5
ID_PREFIXES = {"text_completion": "cmpl", "chat.completion": "chatcmpl"}
Choice = Callable[[str, str | None], dict]


def create_app(served: ServedModel) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI):
        served.engine.start()
        yield
        served.engine.stop()

    app = FastAPI(title="tritontts OpenAI-compatible LLM server", lifespan=lifespan)
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        model = {"id": served.name, "object": "model", "created": 0, "owned_by": "tritontts"}
        return JSONResponse({"object": "list", "data": [model]})

    def start(request: SamplingFields, prompt_ids: list[int]) -> tuple[EngineStream, TextStream]:
        stop_ids, stop_strings = served.stop_ids_and_strings(request)
        params = sampling_params(request, stop_ids, served.engine.runner.max_seq_len)
        vocab, most = served.engine.vocab_size, served.engine.runner.state.max_bad_tokens
        if any(t >= vocab for t in params.bad_token_ids) or len(params.bad_token_ids) > most:
            raise bad_request(f"logit_bias takes at most {most} token ids below {vocab}", "logit_bias")
        try:
            stream = EngineStream(
                served.engine, next(served.request_ids), prompt_ids, params, frozenset(stop_ids[1:])
            )
        except ValueError as error:
            raise bad_request(str(error), "prompt") from error
        return stream, TextStream(served.tokenizer, stop_strings)

    async def generate(stream: EngineStream, text: TextStream) -> AsyncIterator[tuple[str, str | None]]:
        """(new text, finish reason) pairs; the last has the finish reason. Cancels the request on exit."""
        try:
            async for chunk in stream.chunks():
                delta = text.push(chunk.token_ids)
                if text.stopped:
                    yield delta, "stop"
                    return
                if chunk.finish_reason is not None:
                    yield delta + text.flush(), chunk.finish_reason
                    return
                if delta:
                    yield delta, None
        finally:
            stream.close()

    async def respond(
        http: Request,
        request: SamplingFields,
        prompt_ids: list[int],
        obj: str,
        choice: Choice,
        first: dict | None = None,
    ):
        stream, text = start(request, prompt_ids)
        head = {
            "id": f"{ID_PREFIXES[obj]}-{uuid.uuid4().hex}",
            "created": int(time.time()),
            "model": request.model or served.name,
        }
        if request.stream:
            return StreamingResponse(
                sse_events(
                    stream,
                    text,
                    head | {"object": f"{obj}.chunk" if obj == "chat.completion" else obj},
                    choice,
                    first,
                ),
                media_type="text/event-stream",
                background=BackgroundTask(stream.close),
            )
        try:
            pieces = await until_disconnected(http, collect(generate(stream, text)))
        except GenerationError as error:
            raise ApiError(500, str(error), code="generation_failed", type=SERVER_ERROR) from error
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": stream.generated,
            "total_tokens": len(prompt_ids) + stream.generated,
        }
        body = head | {
            "object": obj,
            "choices": [choice("".join(t for t, _ in pieces), pieces[-1][1])],
            "usage": usage,
        }
        return JSONResponse(body)

    async def sse_events(
        stream: EngineStream, text: TextStream, head: dict, choice: Choice, first: dict | None
    ) -> AsyncIterator[str]:
        if first is not None:
            yield sse(head | {"choices": [first]})
        try:
            async for delta, finish in generate(stream, text):
                yield sse(head | {"choices": [choice(delta, finish)]})
        except GenerationError as error:
            yield sse(ApiError(500, str(error), code="generation_failed", type=SERVER_ERROR).body())
        yield sse("[DONE]")

    @app.post("/v1/completions")
    async def completions(http: Request):
        request = validated(CompletionRequest, parse_json_object(await http.body()))
        prompt_ids = completion_prompt_ids(served.tokenizer, request.prompt)

        def choice(text: str, finish: str | None) -> dict:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        return await respond(http, request, prompt_ids, "text_completion", choice)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request):
        request = validated(ChatCompletionRequest, parse_json_object(await http.body()))
        prompt_ids = chat_prompt_ids(served, request)

        def message(text: str, finish: str | None) -> dict:
            content = {"role": "assistant", "content": text}
            return {"index": 0, "message": content, "logprobs": None, "finish_reason": finish}

        def delta(text: str, finish: str | None) -> dict:
            return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}

        first = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return await respond(
            http, request, prompt_ids, "chat.completion", delta if request.stream else message, first
        )

    return app


async def collect(pieces: AsyncIterator[tuple[str, str | None]]) -> list[tuple[str, str | None]]:
    return [piece async for piece in pieces]


async def until_disconnected(http: Request, work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result; cancels it (so its engine request) when the client goes away first."""
    task = asyncio.ensure_future(work)
    try:
        while not (await asyncio.wait({task}, timeout=DISCONNECT_POLL_S))[0]:
            if await http.is_disconnected():
                task.cancel()
                raise ApiError(499, "the client closed the request", code="client_closed_request")
        return task.result()
    finally:
        task.cancel()


def completion_prompt_ids(tokenizer: Tokenizer, prompt: str | list) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise bad_request("only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt).ids
    return list(prompt)


def chat_prompt_ids(served: ServedModel, request: ChatCompletionRequest) -> list[int]:
    if served.chat_template is None:
        raise bad_request("the model's tokenizer has no chat template; use /v1/completions", "messages")
    messages = [{"role": m.role, "content": m.text()} for m in request.messages]
    continue_final = request.continue_final_message
    if continue_final is None:
        continue_final = messages[-1]["role"] == "assistant"
    add_generation_prompt = request.add_generation_prompt
    if add_generation_prompt is None:
        add_generation_prompt = not continue_final
    if continue_final and add_generation_prompt:
        raise bad_request("continue_final_message and add_generation_prompt exclude each other", "messages")
    try:
        text = served.chat_template.render(messages, add_generation_prompt, continue_final)
    except TemplateError as error:
        raise bad_request(f"chat template: {error}", "messages") from error
    return served.tokenizer.encode(text, add_special_tokens=False).ids
