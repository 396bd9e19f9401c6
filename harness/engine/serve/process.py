"""The `bmoe serve` process: its listening socket, its signals and its exit.

- Listen: the address is resolved and bound before the model loads (`listen`): a port in use or a --host that is
  no address here is one line and exit 2. Beyond loopback without an API key, a warning line.
- SIGTERM or SIGINT: the generation in progress stops at its next token and the waiting requests are answered 503;
  open connections get SHUTDOWN_S seconds to finish, the worker SHUTDOWN_S more to leave llama.cpp; then exit 0.
  The bound from the signal to the exit is 2 * SHUTDOWN_S plus one token (or one prefill batch, which llama.cpp
  cannot stop midway). A second signal exits at once (128 + its number), with a line.
- An engine failure (a model file truncated under the server, an I/O error): the failing request gets a JSON 500,
  the others 503, and the process exits 3 with one line, so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from types import FrameType

from harness.engine.run.engine import Engine
from harness.engine.run.session import EngineError
from harness.engine.serve.guard import Guard, door_of, is_loopback
from harness.engine.serve.server import Worker, make_app
from harness.engine.serve.subcommands import ServeFlags
from harness.errors import UserError

SHUTDOWN_S = 5.0


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


def serve(engine: Engine, flags: ServeFlags, sock: socket.socket) -> int:
    import uvicorn

    class Server(uvicorn.Server):
        signalled = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.signalled:
                _say(f"bmoe serve: {signal.Signals(sig).name} again: exiting now")
                os._exit(128 + sig)
            self.signalled = True
            worker.close()  # the running generation stops at its next token
            super().handle_exit(sig, frame)

    def fatal() -> None:  # on the worker thread; uvicorn's loop reads should_exit every 0.1 s
        server.should_exit = True

    app = make_app(engine, flags, fatal)
    worker: Worker = app.state.worker
    door = door_of(flags.host, flags.allow_hosts, flags.max_body_kb, flags.api_key)
    config = uvicorn.Config(Guard(app, door), log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=int(SHUTDOWN_S))
    server = Server(config)

    async def main() -> None:
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
        if not worker.stop(SHUTDOWN_S):  # before the engine closes: the worker may be mid-generation
            _say(f"bmoe serve: the generation did not stop within {SHUTDOWN_S:g} s; exiting without closing the "
                 "engine")
            os._exit(1)
    if worker.fatal:  # the CLI prints it in one line and exits 3
        raise EngineError(f"bmoe serve: engine failure: {worker.fatal}; exiting (restart the server)")
    return 0
