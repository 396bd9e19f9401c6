"""The one thread of `bmoe serve` that touches the engine, and the jobs it answers (harness.engine.serve.server).

A job is one request: the worker takes them in the queue's order, tokenizes its prompt (serve.tokenize: a long one in
a child process), then generates, putting its events on the job's asyncio queue: ("ready", n_prompt) once the
prompt is in, ("delta", (text, telemetry)) per token, then one of ("done", TurnResult), ("error", (status,
message)), ("cancelled", None) or ("closing", None). A job gives up its place in the queue before its last event,
so that a client's next request, sent the moment it has its answer, finds the place free.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.engine.serve.protocol import row_telemetry
from harness.engine.serve.tokenize import Stopped
from harness.engine.serve.turns import Conversation, Sampling
from harness.errors import UserError


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
