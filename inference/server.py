"""``affidavit engine serve``: the embedded engine behind an OpenAI-compatible HTTP API.

Routes: ``POST /v1/chat/completions`` (JSON or SSE), ``POST /v1/responses`` (the Responses
API on the same path: :mod:`inference.responses_reply`), ``POST /v1/messages``
(Anthropic's Messages API on the same path: :mod:`inference.messages_api`), ``GET /v1/models``,
and the debug endpoint ``GET /v1/engine/stats`` (scheduler and prefix-cache counters, the
self-test).
A request is validated (:mod:`inference.protocol`), rendered by the model's chat template,
and handed to the :class:`~inference.scheduler.Scheduler` as a :class:`Job`; a
:class:`Reply` assembles the answer from the events the scheduler streams back: one
``chat.completion``, or ``chat.completion.chunk`` events and then a chunk-shaped event with
``choices: []`` and the ``reproducibility`` block, before ``data: [DONE]``. Chunk framing
is a function of the tokens alone, so a pinned stream is the same bytes on every run.

**Prefix-cache scope.** Cached prefixes are only reused within one scope, derived in this
order: the request's ``cache_salt``; else the ``X-Affidavit-Session`` header (one scope
per session); else the ``user`` field; else one shared default scope for anonymous
requests. ``strict_cache: true`` overrides them all: the request gets a single-use salt
of the engine's own, and since such a salt can only miss, the engine skips the cache
outright: the request neither reads nor leaves shared state (``kv_cache_mode`` ``strict``,
``cached_tokens`` 0), and its bytes, which carry no salt, replay unchanged.

**Tools.** ``tool_choice`` ``none`` masks the ``<tool_call>`` tag out of sampling (where
the tag is several tokens, :mod:`inference.forbidden_text` keeps it, and the
``<tool_response>`` tag, out of the text);
``auto`` samples freely and parses calls from the text afterwards; ``required`` or a named
function constrain decoding with :class:`~inference.constrained.ToolCallGrammar`, so the
arguments parse and match the schema unless ``max_tokens`` cuts them (``finish_reason``
``length``). ``stop`` strings do not apply to constrained tool-call text.

**Access.** Given a token (``engine serve --token-file``), every route answers 401 to a
request without it (:mod:`inference.engine_token`): in the appliance only the proxy holds it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from inference.block import EngineInfo, Reply, reply_identity, reproducibility_block
from inference.checkpoint import Checkpoint, load_checkpoint
from inference.constrained import JsonGrammar, ToolCallGrammar, Vocabulary, validate_tools
from inference.delivery import finished, submit
from inference.engine_token import EngineTokenAuth
from inference.forbidden_text import ForbiddenMasks, ForbiddenText
from inference.model import DecoderModel
from inference.prefix_cache import PrefixCache, cache_scope
from inference.protocol import (
    ApiError,
    ChatRequest,
    ChoiceLogprobs,
    ModelCard,
    ModelList,
    TokenLogprob,
    error_body,
    ignored_fields,
    json_bytes,
    parse_clock,
    parse_request,
    plain_messages,
    response_schema,
    tool_mode,
)
from inference.responses_reply import serve_responses
from inference.sampling import SamplingParams, new_seed
from inference.scheduler import Event, Finished, Job, Scheduler, Ticket, TokenEvent
from inference.self_test import InvarianceReport, self_test
from inference.tokenizer import ChatTemplateError
from inference.tool_calls import CLOSE_TAG, OPEN_TAG
from record.digest import prompt_digest

_T = TypeVar("_T")

__all__ = [
    "SESSION_HEADER",
    "Engine",
    "collect",
    "create_app",
    "on_a_passing_thread",
    "serve",
    "stream",
]

log = logging.getLogger("affidavit.engine")

SESSION_HEADER = "x-affidavit-session"
TOOL_CALL_TAG = "<tool_call>"
#: Under ``tool_choice: "none"`` the model neither calls a tool nor writes a tool's result.
TOOL_RESPONSE_TAG = "<tool_response>"


def on_a_passing_thread(work: Callable[..., _T], *args: Any) -> _T:
    """Run ``work`` on a thread of its own that ends with it, and return what it returned.

    Why: torch's CPU kernels run on OpenMP, and OpenMP (GNU libgomp, which torch's wheels
    ship) gives every thread that starts a parallel region a team of worker threads of its
    own, kept until that thread ends. Once the process has more such workers than cores,
    libgomp stops letting idle workers spin and puts them to sleep after every region, so
    each of the model's many small parallel regions pays a futex wake-up: the scheduler
    thread's decode step ran ~7x slower (1.4 ms against 9.5 ms, tiny model, batch 16, two
    cores) whenever another live thread (the main one, after loading the model and running
    the self-test) had a team. So the heavy start-up work runs here, on a thread whose team
    ends with it, and the scheduler thread is the only one that keeps a team
    (``tests/inference/test_engine_threads.py``)."""
    result: list[_T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(work(*args))
        except BaseException as exc:  # handed to the caller's thread, raised there
            failure.append(exc)

    # daemon: a Ctrl-C while it loads ends the process, not only the wait
    thread = threading.Thread(target=run, name="affidavit-engine-load", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def _load(
    root: Path, batch_invariance: bool
) -> tuple[Checkpoint, DecoderModel, InvarianceReport | None]:
    """The checkpoint, the model and (with batch invariance) the self-test's verdict."""
    checkpoint = load_checkpoint(root)
    model = DecoderModel(checkpoint.config, checkpoint.weights)
    report: InvarianceReport | None = None
    if batch_invariance:
        report = self_test(model)
    else:
        model.linear_path = "stock"
    return checkpoint, model, report


def _all_but(size: int, token: int) -> torch.Tensor:
    """A mask allowing every token but ``token``."""
    mask = torch.ones(size, dtype=torch.bool)
    mask[token] = False
    return mask


class Engine:
    """The loaded model, its tokenizer, the self-test's verdict and the scheduler."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        batch_invariance: bool = True,
        model_name: str | None = None,
        max_batch: int = 64,
        prefix_cache_tokens: int = 65536,
    ) -> None:
        root = Path(model_dir)
        checkpoint, self.model, self.report = on_a_passing_thread(_load, root, batch_invariance)
        self.tokenizer = checkpoint.tokenizer
        self.tokens = checkpoint.tokens
        self.name = model_name or root.resolve().name
        self.context = self.model.config.max_position_embeddings
        self.info = EngineInfo.collect(
            model=self.name,
            weights_digest=checkpoint.weights_digest,
            weights_source=checkpoint.source.to_dict(),
            invariance_path=self.model.linear_path,
            batch_invariance=self.report is not None and self.report.passed,
        )
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self.scheduler = Scheduler(
            self.model,
            decode_text=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True),
            eos_token_ids=self.tokenizer.eos_token_ids,
            prefix_cache=self.prefix_cache,
            max_batch=max_batch,
        )
        self.vocabulary = Vocabulary.build(
            self.tokenizer.to_json(),
            self.tokens.raw,
            self.tokenizer.eos_token_ids,
            vocab_size=self.model.config.vocab_size,
            tag_ids={t: self.tokenizer.token_to_id(t) for t in (OPEN_TAG, CLOSE_TAG)},
        )
        tag = self.tokenizer.token_to_id(TOOL_CALL_TAG)
        self._no_tool_calls: torch.Tensor | None = None
        self._no_tool_text: ForbiddenMasks | None = None  # built on first use (about 1 s)
        if tag is not None:
            self._no_tool_calls = on_a_passing_thread(_all_but, self.model.config.vocab_size, tag)

    def _none_constraint(self) -> ForbiddenText:
        """``tool_choice: "none"`` where the tag is several tokens: neither tag in the text."""
        if self._no_tool_text is None:
            self._no_tool_text = ForbiddenMasks(
                self.tokens.texts, (TOOL_CALL_TAG, TOOL_RESPONSE_TAG)
            )
        return ForbiddenText(self._no_tool_text, self.tokens.texts)

    def start(self) -> Engine:
        """Start the scheduler thread."""
        self.scheduler.start()
        return self

    def close(self) -> None:
        """Stop the scheduler thread."""
        self.scheduler.close()

    def stats(self) -> dict[str, Any]:
        """The debug endpoint's body."""
        return {
            "scheduler": asdict(self.scheduler.stats()),
            "prefix_cache": asdict(self.prefix_cache.stats()),
            "engine": self.info.to_dict(),
            "self_test": self.report.to_dict() if self.report is not None else None,
        }

    def prepare(self, body: bytes, headers: Mapping[str, str]) -> tuple[Job, Reply]:
        """Validate a request and turn it into a scheduler job and its reply's frame."""
        request, raw = parse_request(body)
        extra = ignored_fields(request)
        if extra:
            log.debug("ignoring request fields this engine does not implement: %s", extra)
        if request.model != self.name:
            raise ApiError(
                f"model {request.model!r} does not exist; this engine serves {self.name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
        tools = self._tools(request)
        mode, choice = tool_mode(request.tool_choice, tools)
        clock = parse_clock(request.clock) if request.clock is not None else None
        try:
            text = self.tokenizer.render(
                plain_messages(request.messages), tools=self._shown_tools(tools, mode), now=clock
            )
        except ChatTemplateError as exc:
            raise ApiError(str(exc), param="messages") from None
        prompt_ids = self.tokenizer.encode(text)
        max_tokens = self._max_tokens(request, len(prompt_ids))
        seed = request.seed if request.seed is not None else new_seed()
        params = SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=seed,
            logprobs=request.logprobs,
            top_logprobs=request.top_logprobs or 0,
        )
        constrained = mode in ("required", "named")
        grammar = self._grammar(tools, choice) if constrained and tools else None
        schema = None if grammar is not None else response_schema(request.response_format)
        shaped = None
        if schema is not None:
            shaped = self._json_grammar(schema, tools if mode == "auto" else None)
        forbid = mode == "none" and tools and self._no_tool_calls is None and shaped is None
        job = Job(
            prompt_ids=prompt_ids,
            params=params,
            seed=seed,
            max_tokens=max_tokens,
            stop=() if constrained or shaped is not None else request.stop_strings(),
            hold=(TOOL_CALL_TAG,) if mode == "auto" and tools else (),
            allowed=self._no_tool_calls if mode == "none" and tools else None,
            constraint=self._none_constraint() if forbid else grammar or shaped,
            scope=cache_scope(
                strict=request.strict_cache,
                cache_salt=request.cache_salt,
                session=headers.get(SESSION_HEADER),
                user=request.user,
            ),
            stream_text=not constrained,
        )
        identity = reply_identity(body, pinned=request.seed is not None, clock=clock)
        digest = prompt_digest(raw)
        block = reproducibility_block(
            self.info,
            request_id=identity.request_id,
            seed=seed,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            max_tokens=max_tokens,
            clock=request.clock,
            kv_cache_mode="strict" if request.strict_cache else "shared",
            cached_tokens=0,
            batch_peers_max=0,
            prompt_digest=digest,
            prompt_token_ids=prompt_ids,
        )
        reply = Reply(
            identity=identity,
            model=request.model,
            fingerprint=self.info.system_fingerprint,
            block=block,
            tool_mode=mode if tools else "none",
            grammar=grammar,
            prompt_digest=digest,
            seed=seed,
            logprobs=request.logprobs,
            stream=request.stream,
            include_usage=bool(request.stream_options and request.stream_options.include_usage),
            tokens=self.tokens,
        )
        return job, reply

    def _shown_tools(
        self, tools: list[dict[str, Any]] | None, mode: str
    ) -> list[dict[str, Any]] | None:
        """The tools the prompt lists. A template without tool support is not shown tools it
        may not call (``tool_choice: "none"``): a small model shown the fallback's tools
        block answers in its markup instead of in words."""
        return None if mode == "none" and not self.tokenizer.supports_tools else tools

    def _grammar(self, tools: list[dict[str, Any]], choice: Any) -> ToolCallGrammar:
        try:
            return ToolCallGrammar(self.vocabulary, tools, choice)
        except ValueError as exc:
            raise ApiError(f"invalid tools: {exc}", param="tools", code="invalid_tools") from None

    def _json_grammar(self, schema: Any, tools: list[dict[str, Any]] | None) -> JsonGrammar:
        try:
            return JsonGrammar(self.vocabulary, schema, tools=tools)
        except ValueError as exc:
            raise ApiError(
                f"invalid response_format: {exc}", param="response_format", code="invalid_schema"
            ) from None

    def _tools(self, request: ChatRequest) -> list[dict[str, Any]] | None:
        if not request.tools:
            return None
        try:
            return validate_tools(request.tools)
        except ValueError as exc:
            raise ApiError(f"invalid tools: {exc}", param="tools", code="invalid_tools") from None

    def _max_tokens(self, request: ChatRequest, prompt_tokens: int) -> int:
        room = self.context - prompt_tokens
        if room < 1:
            raise ApiError(
                f"the prompt is {prompt_tokens} tokens; the context holds {self.context}",
                param="messages",
                code="context_length_exceeded",
            )
        wanted = request.requested_max_tokens()
        if wanted is not None and wanted > room:
            raise ApiError(
                f"max_tokens {wanted} plus the prompt's {prompt_tokens} tokens exceeds the "
                f"context of {self.context} tokens",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return wanted if wanted is not None else room


def _failure(done: Finished) -> ApiError:
    return ApiError(
        done.error or "generation failed", status=500, code="engine_error", type="server_error"
    )


async def collect(
    reply: Reply, events: asyncio.Queue[Event], disconnected: Callable[[], Awaitable[bool]]
) -> tuple[int, bytes]:
    """Wait for the end of a sequence: the status and body of the JSON reply.

    A client that left gets 499 (:func:`inference.delivery.finished`; the caller frees the
    slot).
    """
    entries: list[TokenLogprob] = []

    def keep(event: TokenEvent) -> None:
        if reply.logprobs:
            entries.append(reply.tokens.logprob(event.token))

    done = await finished(events, disconnected, keep)
    if done is None:
        return 499, b""
    if done.reason in ("error", "cancelled"):
        failure = _failure(done)
        return failure.status, json_bytes(failure.body())
    return 200, json_bytes(reply.completion(done, entries).model_dump(mode="json"))


async def stream(
    reply: Reply, events: asyncio.Queue[Event], ticket: Ticket
) -> AsyncIterator[bytes]:
    """The SSE events of a reply, ``data: [DONE]`` last; frees the slot however it ends."""
    try:
        async for chunk in _events(reply, events):
            yield chunk
    finally:
        ticket.cancel()


async def _events(reply: Reply, events: asyncio.Queue[Event]) -> AsyncIterator[bytes]:
    text_mode = reply.grammar is None
    yield reply.chunk({"role": "assistant", "content": "" if text_mode else None})
    sent = ""
    while True:
        event = await events.get()
        if isinstance(event, TokenEvent):
            logprobs = None
            if reply.logprobs:
                logprobs = ChoiceLogprobs(content=[reply.tokens.logprob(event.token)])
            if event.text or logprobs is not None:
                yield reply.chunk({"content": event.text} if text_mode else {}, logprobs=logprobs)
                sent += event.text
            continue
        break
    if event.reason in ("error", "cancelled"):
        yield b"data: " + json_bytes(_failure(event).body()) + b"\n\n"
        yield _DONE
        return
    if event.tail:
        yield reply.chunk({"content": event.tail})
        sent += event.tail
    content, tool_calls, reason = reply.outcome(event)
    if tool_calls and content and content.startswith(sent) and len(content) > len(sent):
        yield reply.chunk({"content": content[len(sent) :]})
    if tool_calls:
        calls = [{"index": i, **c.model_dump(mode="json")} for i, c in enumerate(tool_calls)]
        yield reply.chunk({"tool_calls": calls})
    yield reply.chunk({}, finish_reason=reason)
    yield reply.trailer(event)
    yield _DONE


_DONE = b"data: [DONE]\n\n"


def _error_response(exc: ApiError) -> Response:
    return Response(json_bytes(exc.body()), status_code=exc.status, media_type="application/json")


def create_app(engine: Engine, *, token: str | None = None) -> FastAPI:
    """The FastAPI app over a started :class:`Engine` (the caller owns its lifecycle).

    ``token``: every request must carry it (:class:`~inference.engine_token.EngineTokenAuth`,
    401 without); ``None`` leaves the engine open to whoever can connect."""
    app = FastAPI(title="affidavit embedded engine", docs_url=None, redoc_url=None)
    if token is not None:
        app.add_middleware(EngineTokenAuth, token=token)

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        body = error_body(str(exc.detail), type="invalid_request_error", param=None, code=None)
        return JSONResponse(body, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        body = error_body(f"internal error: {exc}", type="server_error", param=None, code=None)
        return JSONResponse(body, status_code=500)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return ModelList(data=[ModelCard(id=engine.name)]).model_dump()

    @app.get("/v1/engine/stats")
    async def stats() -> dict[str, Any]:
        return engine.stats()

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await serve_responses(engine, request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.body()
        try:  # off the event loop: rendering, tokenizing and grammar set-up take a while
            job, reply = await run_in_threadpool(engine.prepare, body, request.headers)
        except ApiError as exc:
            return _error_response(exc)
        events, ticket = submit(engine.scheduler, job)
        if reply.stream:
            return StreamingResponse(stream(reply, events, ticket), media_type="text/event-stream")
        try:
            status, payload = await collect(reply, events, request.is_disconnected)
        finally:
            ticket.cancel()
        return Response(payload, status_code=status, media_type="application/json")

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        from inference.messages_api import handle  # Anthropic's Messages API

        return await handle(engine, request)

    return app


def serve(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    token: str | None = None,
) -> None:
    """Bind, print the address (port 0 picks a free one), and serve until interrupted;
    ``token`` as for :func:`create_app`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    # idle connections kept longer than a client keeps them (the proxy's pool: 1 s; httpx: 5 s),
    # so the client always lets go first and never sends on a connection being closed
    config = uvicorn.Config(
        create_app(engine, token=token), log_level=log_level, timeout_keep_alive=30
    )
    server = uvicorn.Server(config)
    engine.start()
    print(f"affidavit engine serving {engine.name!r} on http://{host}:{bound}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()
        sock.close()
