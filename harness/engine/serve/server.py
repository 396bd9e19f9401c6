"""`bmoe serve`: an OpenAI-compatible HTTP server (FastAPI on uvicorn) over one loaded engine.

One model, one context: a single worker thread tokenizes and generates, one request at a time; the others wait in
a bounded queue (`--queue`, behind the one being answered), and a request that finds it full gets 503 with
Retry-After. A prompt whose bytes cannot fit in the context is refused before it is queued (serve.tokenize: no
tokenizing); a long one is tokenized in a child process that a disconnect or the shutdown kills, and that
`--tokenize-timeout` bounds. A client that disconnects, streaming or not, cancels its request while it is queued,
tokenized or generated (at the next token; its connection is watched throughout). Errors before the first token
(bad JSON, a bad field, text that is not Unicode, an unknown model, a prompt longer than the context or too slow to
tokenize) get a 4xx JSON error object, streaming or not; anything else a JSON 500.
The KV prefix is reused only for the same conversation: a request whose `user` names the conversation whose tokens
the cache holds (the chat page sends a random one per page); any other request starts from an empty cache, so no
client can learn another's prompt from `cached_tokens` or from its prefill time.
After an engine failure the worker refuses all further work and the server exits (harness.engine.serve.process).
Endpoints: POST /v1/chat/completions and /v1/completions (SSE streaming with `stream: true`), GET /v1/models,
GET /health, and the chat page at / (harness/engine/serve/web/); the request checks in front of them (Host,
API key, body size) are harness.engine.serve.guard.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness.engine.run.engine import Engine
from harness.engine.serve.openai_api import FINISH, ChatRequest, CompletionRequest, Ids, error_body
from harness.engine.serve.subcommands import ServeFlags
from harness.engine.serve.turns import Conversation, TurnResult, sampling_of
from harness.engine.serve.worker import Job, Worker
from harness.errors import UserError

WEB = Path(__file__).with_name("web")


def _err(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
         headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, code), status_code=status, headers=headers)


def make_app(engine: Engine, flags: ServeFlags, on_fatal: Callable[[], None] = lambda: None) -> FastAPI:
    conv = Conversation(engine)
    worker = Worker(conv, 1 + flags.queue, on_fatal, flags.tokenize_timeout)
    model_id = flags.model_name or os.path.basename(engine.cfg.model).removesuffix(".gguf")
    started = int(time.time())
    app = FastAPI(title="bmoe", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.worker = worker

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return _err(400, "the request body is not valid JSON", code="invalid_json")
        where = ".".join(str(x) for x in first.get("loc", ())[1:]) or "body"
        return _err(400, f"{where}: {first.get('msg', 'invalid')}", code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _err(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:  # the guard logs it in one line
        return _err(500, f"internal error: {type(exc).__name__}", "server_error", "internal_error")

    @app.get("/health")
    async def health() -> JSONResponse:
        c = worker.counters
        running = min(worker.pending, 1)
        body = {"status": "failed" if worker.fatal else "ok", "model": model_id, "running": running,
                "running_phase": worker.phase if running else "", "running_tokens": worker.progress if running else 0,
                "waiting": max(worker.pending - 1, 0),
                "capacity": worker.capacity, "served": c.served,
                "cancelled": c.cancelled, "refused": c.refused, "last": c.last}
        if worker.fatal:
            body["error"] = worker.fatal
        return JSONResponse(body, status_code=500 if worker.fatal else 200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": started,
                                            "owned_by": "bmoe", "n_ctx": engine.cfg.ctx, "arch": engine.layout.arch}]}

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(WEB / "index.html", media_type="text/html")

    async def answer(request: Request, req: ChatRequest | CompletionRequest, chat: bool):
        if req.model and req.model != model_id:
            return _err(404, f"unknown model {req.model!r}; this server has {model_id!r} (GET /v1/models)",
                        code="model_not_found")
        problem = req.unsupported()
        if problem:
            return _err(400, problem, code="unsupported")
        messages = req.history() if isinstance(req, ChatRequest) else None
        prompt = req.prompt if isinstance(req, CompletionRequest) else None
        try:  # cheap checks here; the template and the tokenizing are the worker's, in the queue's order
            sp = sampling_of(engine.cfg, **req.sampling())
            conv.check_size(prompt if messages is None else "".join(m["content"] for m in messages), sp.n_predict)
        except UserError as e:
            return _refused(400, str(e))
        if worker.closing or worker.fatal:
            return _closing()
        job = Job(sp, asyncio.get_running_loop(), messages, prompt, req.user or None)
        if not worker.submit(job):
            wait = max(1, math.ceil(worker.counters.mean_s * worker.capacity))
            return _err(503, f"busy: {worker.capacity} request(s) already running or queued; retry later",
                        "server_busy", "queue_full", headers={"Retry-After": str(wait)})
        watch = asyncio.create_task(_watch(request, job))  # a client gone while it waits or tokenizes cancels it
        try:
            kind, val = await job.out.get()
        except asyncio.CancelledError:  # this handler cancelled (the shutdown's grace over)
            watch.cancel()
            job.cancel.set()
            raise
        if kind != "ready":  # refused, cancelled or closing before the first token: a plain JSON answer
            watch.cancel()
            job.cancel.set()
            return _final(kind, val)
        return await _reply(watch, job, Ids(chat, model_id), req.stream)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, req: ChatRequest):
        return await answer(request, req, True)

    @app.post("/v1/completions")
    async def completions(request: Request, req: CompletionRequest):
        return await answer(request, req, False)

    return app


def _closing() -> JSONResponse:
    return _err(503, "the server is shutting down; retry later (against its restart)", "server_busy",
                "shutting_down", headers={"Retry-After": "5"})


def _refused(status: int, message: str) -> JSONResponse:
    if status >= 500:
        return _err(status, message, "server_error", "engine_failure")
    code = ("context_length_exceeded" if "exceeds the context" in message else
            "prompt_too_slow" if "to tokenize" in message else "invalid_value")
    return _err(status, message, code=code)


def _final(kind: str, val: Any) -> JSONResponse:
    """The answer to a job that ended without a reply: an error, a cancel or the shutdown."""
    if kind == "error":
        return _refused(*val)
    if kind == "cancelled":
        return _err(499, "cancelled: the client went away", code="cancelled")
    return _closing()


async def _watch(request: Request, job: Job) -> None:
    """Cancels the job the moment its client goes away (the body is read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel.set()


async def _reply(watch: asyncio.Task, job: Job, ids: Ids, stream: bool) -> JSONResponse | StreamingResponse:
    if stream:
        return StreamingResponse(_sse(watch, job, ids), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _whole(watch, job, ids)


async def _whole(watch: asyncio.Task, job: Job, ids: Ids) -> JSONResponse:
    try:
        while True:
            kind, val = await job.out.get()
            if kind == "done":
                return JSONResponse(ids.whole(val))
            if kind != "delta":
                return _final(kind, val)
    finally:
        watch.cancel()
        job.cancel.set()  # a no-op once done; stops the generation if this handler was cancelled


def _data(obj: dict[str, Any]) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False) + "\n\n"


async def _sse(watch: asyncio.Task, job: Job, ids: Ids) -> AsyncIterator[str]:
    try:
        yield _data(ids.chunk("" if not ids.chat else None, role=True))
        sent = 0
        while True:
            kind, val = await job.out.get()
            if kind == "delta":
                text, tele = val
                sent += len(text)
                yield _data(ids.chunk(text, telemetry=tele))
            elif kind == "done":
                res: TurnResult = val
                if len(res.text) > sent:  # U+FFFD for a UTF-8 sequence cut off at the end
                    yield _data(ids.chunk(res.text[sent:]))
                yield _data(ids.chunk(None if ids.chat else "", finish=FINISH[res.finish]))
                yield _data(ids.usage_chunk(res))
                yield "data: [DONE]\n\n"
                return
            elif kind in ("error", "closing"):
                msg = val[1] if kind == "error" else "the server is shutting down; retry later"
                yield _data(error_body(msg, "server_error"))
                yield "data: [DONE]\n\n"
                return
            else:
                return
    finally:
        watch.cancel()
        job.cancel.set()  # the client went away (or the stream ended): stop generating for it
