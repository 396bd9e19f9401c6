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
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from harness.engine.run.engine import Engine
from harness.engine.serve.openai_api import FINISH, ChatRequest, CompletionRequest, Ids, error_body
from harness.engine.serve.protocol import row_telemetry
from harness.engine.serve.subcommands import ServeFlags
from harness.engine.serve.tokenize import Stopped
from harness.engine.serve.turns import Conversation, Sampling, TurnResult, sampling_of
from harness.errors import UserError

WEB = Path(__file__).with_name("web")


@dataclass
class Job:
    sampling: Sampling
    loop: asyncio.AbstractEventLoop
    messages: list[dict[str, str]] | None = None  # a chat history (through the template), or
    prompt: str | None = None  # a raw prompt; the worker tokenizes either, in its turn
    owner: str | None = None  # the conversation (the request's `user`); None: no KV reuse either way
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    released: bool = False  # its place in the queue given up (Worker._release)

    def put(self, item: tuple[str, Any]) -> None:
        try:
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        except RuntimeError:  # the event loop has closed (the shutdown): nobody waits for it any more
            pass


@dataclass
class Counters:
    served: int = 0
    cancelled: int = 0
    refused: int = 0
    failed: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    mean_s: float = 1.0  # a request's mean duration, for Retry-After


class Worker:
    """The one thread that touches the engine."""

    def __init__(self, conv: Conversation, capacity: int, on_fatal: Callable[[], None] = lambda: None,
                 tokenize_s: float = 10.0):
        self.conv = conv
        self.tokenize_s = tokenize_s
        self.capacity = capacity  # the running job plus the waiting ones
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.pending = 0  # queued or running
        self.lock = threading.RLock()
        self.counters = Counters()
        self.fatal: str | None = None
        self.on_fatal = on_fatal  # called once, on the worker thread, after an engine failure
        self.closing = False
        self.current: Job | None = None
        self.kv_owner: str | None = None  # the conversation whose tokens the KV cache holds
        self.progress = 0  # tokens generated so far by the running job
        self.phase = ""  # what the running job does: "tokenizing" or "generating"
        self.thread = threading.Thread(target=self._loop, name="bmoe-serve-worker", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> bool:
        with self.lock:
            if self.pending >= self.capacity or self.fatal or self.closing:
                self.counters.refused += 1
                return False
            self.pending += 1
        self.jobs.put(job)
        return True

    def close(self) -> None:
        """Cancel the running job (tokenizing, prefill or decode) and answer the waiting ones 503. From a signal
        handler, set `closing` there and call this on the event loop (it takes locks)."""
        self.closing = True
        job = self.current
        if job:
            job.cancel.set()
        self._drain()
        self.jobs.put(None)

    def fail(self, why: str) -> None:
        """The engine cannot go on (its model file changed under it) while the worker is stuck inside llama.cpp:
        the running request gets a 500 naming why, the waiting ones 503."""
        self.counters.failed += 1
        self.fatal = why
        job = self.current
        if job:
            self._end(job, ("error", (500, f"engine failure: {why}")))
        self.close()

    def stop(self, timeout: float) -> bool:
        """close(), then wait for the thread; False if it is still inside llama.cpp after `timeout` seconds."""
        self.close()
        self.thread.join(timeout=timeout)
        return not self.thread.is_alive()

    def _release(self, job: Job) -> None:
        with self.lock:
            if not job.released:
                job.released = True
                self.pending -= 1

    def _end(self, job: Job, item: tuple[str, Any]) -> None:
        """The job's last event, its place in the queue given up first: a client that sends its next request the
        moment it has this answer finds the place free."""
        self._release(job)
        job.put(item)

    def _drain(self) -> None:
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                with self.lock:
                    self.pending -= 1
                self._end(job, ("closing", None))

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            self.current = job
            try:
                self._run(job)
            finally:
                self.current = None
                self.phase = ""
                self._release(job)
        self._drain()  # the ones queued behind the end

    def _stopped(self, job: Job) -> None:
        if self.closing:
            self._end(job, ("closing", None))
        else:
            self.counters.cancelled += 1
            self._end(job, ("cancelled", None))

    def _run(self, job: Job) -> None:
        c = self.counters
        if self.fatal or self.closing or job.cancel.is_set():  # its client went away while it waited
            self._stopped(job)
            return

        def stop() -> bool:
            return job.cancel.is_set() or self.closing

        t0 = time.perf_counter()
        self.progress = 0
        self.phase = "tokenizing"
        try:
            sp = job.sampling
            tokens = self.conv.prompt_tokens(messages=job.messages, prompt=job.prompt, n_predict=sp.n_predict,
                                             stop=stop, limit_s=self.tokenize_s)
            self.conv.check_fits(tokens, sp.n_predict)
        except Stopped:
            self._stopped(job)
            return
        except UserError as e:
            self._end(job, ("error", (400, str(e))))
            return
        except Exception as e:  # noqa: BLE001 - the tokenizing failed (a fork refused): this request, not the engine
            self._end(job, ("error", (500, f"{type(e).__name__}: {e}")))
            return
        job.put(("ready", len(tokens)))
        self.phase = "generating"
        reuse = job.owner is not None and job.owner == self.kv_owner
        self.kv_owner = job.owner  # the cache now holds this request's tokens (or none, after a failure)
        try:
            for d in self.conv.generate(tokens, sp, stop, reuse=reuse):
                self.progress += 1
                job.put(("delta", (d.text, {"step": d.row.step, "token_id": d.row.token_id, **row_telemetry(d.row)})))
        except UserError as e:
            self._end(job, ("error", (400, str(e))))
            return
        except Exception as e:  # noqa: BLE001 - an engine failure: this request fails, the server exits
            if self.closing and not self.fatal:  # the decode aborted by the shutdown (serve.process)
                self._end(job, ("closing", None))
                return
            c.failed += 1
            self.fatal = self.fatal or f"{type(e).__name__}: {e}"
            self._end(job, ("error", (500, f"engine failure: {self.fatal}")))
            self.on_fatal()
            return
        res = self.conv.last
        assert res is not None
        c.cancelled += res.finish == "cancelled"
        c.served += res.finish != "cancelled"
        c.mean_s = 0.8 * c.mean_s + 0.2 * (time.perf_counter() - t0)
        c.last = {"finish": res.finish, "tokens": len(res.tokens), "n_reused": res.n_reused}
        self._end(job, ("closing" if res.finish == "cancelled" and self.closing else "done", res))


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
        kind, val = await job.out.get()
        if kind != "ready":  # refused, cancelled or closing before the first token: a plain JSON answer
            watch.cancel()
            job.cancel.set()
            return _final(kind, val)
        ids = Ids(chat, model_id)
        if req.stream:
            return StreamingResponse(_sse(watch, job, ids), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _whole(watch, job, ids)

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
