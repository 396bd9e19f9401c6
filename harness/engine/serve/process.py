"""The `bmoe serve` process: its listening socket, its signals and its exit.

- Listen: the address is resolved and bound before the model loads (`listen`): a port in use or a --host that is
  no address here is one line and exit 2. Beyond loopback without an API key, a warning line.
- SIGTERM or SIGINT: whatever the worker is doing stops at once: a prompt being tokenized (its child process is
  killed), a prefill or a decode inside llama.cpp (its abort callback, from the compiled helper, read between
  graph nodes), a request waiting in the queue (503). Open connections get GRACE_S to take their answers; once the
  worker has left llama.cpp the engine's files are closed and the process exits 0 (its memory and threads left to
  the kernel). If the worker is still inside one graph
  node STOP_S after the signal (a starved CPU), the process exits 0 without closing the engine (the kernel frees
  it all), with a line: within 2 s of the signal either way. A second signal exits at once (128 + its number),
  with a line. Before the server listens (during the load) SIGTERM ends the process
  by its default action, at once and without output (status 143; -15 to a Python parent).
- An engine failure (an I/O error on an expert read): the failing request gets a JSON 500, the others 503, and
  the process exits 3 with one line, so that a supervisor restarts it.
- A model file truncated or replaced under the running server (a SIGBUS in its mapping, harness.engine.io.lazymap):
  the compiled handler parks the faulting thread and wakes the event loop, which answers the request in flight a
  JSON 500 naming the file and the others 503, then exits 4 with the handler's line (the handler itself exits 4
  after FAULT_GRACE_MS if the event loop cannot answer). Without the compiled helper (or BMOE_MODEL_WATCH=thread)
  the pure-Python watcher does the same through lazymap.defer_changes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys
import time
from types import FrameType

from harness.engine.io import lazymap
from harness.engine.run.engine import Engine
from harness.engine.run.session import EngineError
from harness.engine.serve.guard import Guard, door_of, is_loopback
from harness.engine.serve.server import make_app
from harness.engine.serve.subcommands import ServeFlags
from harness.engine.serve.worker import Worker
from harness.errors import UserError

GRACE_S = 0.4  # after SIGTERM: for open connections to take their answers (a body that never comes: 503)
STOP_S = 0.8  # from the signal: the worker has left llama.cpp by then, or the process exits without closing it
FAULT_GRACE_MS = 3000
EXIT_MODEL_CHANGED = 4


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def listen(flags: ServeFlags) -> socket.socket:
    """The bound socket (not yet listening), or UserError in one line."""
    try:
        info = socket.getaddrinfo(flags.host or None, flags.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"bmoe serve: --host {flags.host!r} does not resolve ({getattr(e, 'strerror', e)}); "
                        "give an address of this machine (127.0.0.1, 0.0.0.0, ::1) or a name that resolves") from None
    family, kind, proto, _, addr = info[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        hint = ("another process listens there: pick another --port (0 = any free one)" if e.errno == 98 else
                "give an address of this machine with --host")
        raise UserError(f"bmoe serve: cannot listen on {flags.host}:{flags.port}: {e.strerror}; {hint}") from None
    if not flags.api_key and not is_loopback(flags.host):
        _say(f"bmoe serve: warning: listening on {flags.host} without an API key: anyone who reaches this port "
             "can use the model; set BMOE_API_KEY (or --api-key)")
    return sock


def _helper() -> ctypes.CDLL | None:
    so = lazymap.shim_path()
    try:
        return ctypes.CDLL(so) if so else None
    except OSError:
        return None


def install_abort(engine: Engine) -> ctypes.c_int | None:
    """A flag that, set to 1, stops the llama_decode in progress (llama.cpp's abort callback, read by the compiled
    helper's bmoe_flag_is_set without the GIL); None without the helper (a prefill then runs to its end)."""
    fn = getattr(_helper(), "bmoe_flag_is_set", None)
    if fn is None:
        return None
    L, flag = engine.session.L, ctypes.c_int(0)
    cb = L.ggml_abort_callback(ctypes.cast(fn, ctypes.c_void_p).value)
    L.llama_set_abort_callback(engine.session.ctx, cb, ctypes.cast(ctypes.pointer(flag), ctypes.c_void_p))
    _KEEP.extend([cb, flag])
    return flag


def defer_model_faults() -> int | None:
    """The read end of a pipe the compiled SIGBUS handler writes a byte to (and then waits) instead of exiting at
    once; None without it."""
    fn = getattr(_helper(), "bmoe_sigbus_notify", None)
    if fn is None:
        return None
    r, w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    fn(w, FAULT_GRACE_MS)
    _KEEP.extend([r, w])
    return r


def fault_reason(sizes: dict[str, int]) -> str:
    for path, size in sizes.items():
        try:
            now = os.stat(path).st_size
        except OSError as e:
            return f"{path} cannot be read any more under the running engine ({e.strerror})"
        if now != size:
            return f"{path} changed size under the running engine ({size} bytes at load, {now} now)"
    return "a read through the model's file mapping failed (SIGBUS: the file was truncated, replaced or its " \
           "storage failed)"


_KEEP: list[object] = []  # what llama.cpp and the SIGBUS handler point at, for the life of the process


def serve(engine: Engine, flags: ServeFlags, sock: socket.socket) -> int:
    import uvicorn

    loops: list[asyncio.AbstractEventLoop] = []
    signalled_at: list[float] = []
    faults: list[str] = []

    class Server(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.signalled:
                _say(f"bmoe serve: {signal.Signals(sig).name} again: exiting now")
                os._exit(128 + sig)
            self.signalled = True
            signalled_at.append(time.monotonic())
            worker.closing = True  # the running job stops at its next check, the decode in progress now
            if abort is not None:
                abort.value = 1
            if loops:  # the rest takes locks: not in a signal handler
                loops[0].call_soon_threadsafe(worker.close)
            super().handle_exit(sig, frame)

    def fatal() -> None:  # on the worker thread; uvicorn's loop reads should_exit every 0.1 s
        server.should_exit = True

    app = make_app(engine, flags, fatal)
    worker: Worker = app.state.worker
    abort = install_abort(engine)
    sizes = {str(p): os.stat(p).st_size for p in engine.layout.shards}
    wake = defer_model_faults()

    def model_fault() -> None:  # on the event loop: the worker's thread is parked in the SIGBUS handler
        os.read(wake, 64)
        if not faults:
            faults.append(fault_reason(sizes))
            worker.fail(f"{faults[0]}; restore it and restart the server")
            server.should_exit = True

    def model_changed(why: str) -> None:  # on the event loop, from the pure-Python watcher (no compiled helper)
        if not faults:
            faults.append(why)
            worker.fail(f"{why}; restore it and restart the server")
            server.should_exit = True

    lazymap.defer_changes(lambda why: loops[0].call_soon_threadsafe(model_changed, why) if loops else None,
                          FAULT_GRACE_MS / 1000)
    door = door_of(flags.host, flags.allow_hosts, flags.max_body_kb, flags.api_key)
    config = uvicorn.Config(Guard(app, door), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=GRACE_S)  # type: ignore[arg-type] - a float works
    server = Server(config)

    async def main() -> None:
        loops.append(asyncio.get_running_loop())
        if wake is not None:
            loops[0].add_reader(wake, model_fault)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            host, port = server.servers[0].sockets[0].getsockname()[:2]
            _say(f"bmoe: serving {os.path.basename(engine.cfg.model)} on http://{host}:{port} "
                 f"(queue {flags.queue}; {'API key required; ' if flags.api_key else ''}Ctrl-C stops)")
        await task

    # uvicorn re-raises the signal it caught under the handler it found once it has shut down: a handler that
    # does nothing here makes that a clean exit (status 0, the engine closed by the caller)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        asyncio.run(main())
    finally:
        if faults:  # the worker is parked in the SIGBUS handler: nothing can be closed
            _say(f"bmoe: error: {faults[0]}; do not change a model file while it runs: restore it and run again")
            os._exit(EXIT_MODEL_CHANGED)
        left = signalled_at[0] + STOP_S - time.monotonic() if signalled_at else STOP_S
        if not worker.stop(max(left, 0.05)):  # before the engine closes: the worker may be inside llama.cpp
            _say(f"bmoe serve: llama.cpp was still inside a graph node {STOP_S:g} s after the shutdown began; "
                 "exiting without closing the engine")
            os._exit(3 if worker.fatal else 0)
    if worker.fatal:  # the CLI prints it in one line and exits 3
        raise EngineError(f"bmoe serve: engine failure: {worker.fatal}; exiting (restart the server)")
    # the worker is out of llama.cpp: the engine's files are closed, its memory and threads left to the kernel (freeing
    # a model, joining read lanes and the interpreter's teardown took seconds on a loaded machine)
    for sink in engine.sinks:
        sink.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
