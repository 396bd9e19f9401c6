"""The door of `bmoe serve`: an ASGI middleware in front of the app that every request passes first.

- Host: the `Host` header must name this server (loopback names, the --host it listens on, and each --allow-host;
  `--allow-host '*'` allows any): a web page that rebinds its DNS name to 127.0.0.1 gets 421, never the model.
- API key: with one set (--api-key or BMOE_API_KEY) every endpoint but /health and the page at / wants
  `Authorization: Bearer KEY` (401 otherwise); the page is static and asks for the key itself.
- Body size: a request whose Content-Length exceeds the limit gets 413 before any of its body is read; a chunked
  body is counted while it is read and refused the moment it passes the limit (the rest is never read); the app
  gets the body only once it is known to fit.
- Errors: anything the app lets escape becomes a JSON 500 (if no response has started) and one line on stderr; a
  request cancelled by the shutdown (its grace over) ends without a traceback.
Every refusal is an OpenAI-style JSON error object. Pure ASGI: no engine, no server state.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from harness.engine.serve.openai_api import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("", "0.0.0.0", "::")
OPEN_PATHS = ("/health", "/")  # answered without the API key: the probe and the static page


class _Started:
    """A send that notes whether the response has started (after that, an error can only end the connection)."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, m: Message) -> None:
        self.started = self.started or m["type"] == "http.response.start"
        await self.send(m)


@dataclass(frozen=True)
class Door:
    max_body: int  # bytes
    hosts: frozenset[str] | None  # None: any Host
    api_key: str = ""


def door_of(host: str, allow_hosts: tuple[str, ...], max_body_kb: int, api_key: str) -> Door:
    if "*" in allow_hosts:
        return Door(max_body_kb * 1024, None, api_key)
    names = {*LOOPBACK_NAMES, *(h.lower().strip("[]") for h in allow_hosts)}
    if host not in WILDCARDS:
        names.add(host.lower().strip("[]"))
    return Door(max_body_kb * 1024, frozenset(names), api_key)


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def host_name(value: str) -> str:
    """The name in a Host header: without the port, brackets or a trailing dot, lower case."""
    v = value.strip().lower()
    if v.startswith("["):
        return v[1:v.find("]")] if "]" in v else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return v.decode("latin-1")
    return None


async def send_error(send: Send, status: int, message: str, code: str, headers: dict[str, str] | None = None,
                     type_: str = "invalid_request_error", close: bool = True) -> None:
    body = json.dumps(error_body(message, type_, code)).encode()  # ASCII: any text in the message is escaped
    h = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:  # the body was not read: the connection closes rather than read (and drop) the rest of it
        h.append((b"connection", b"close"))
    h += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": h})
    await send({"type": "http.response.body", "body": body})


class Guard:
    def __init__(self, app: ASGIApp, door: Door, log: Callable[[str], None] | None = None):
        self.app, self.door = app, door
        self.log = log or (lambda line: (sys.stderr.write(line + "\n"), sys.stderr.flush()))

    def refusal(self, scope: Scope) -> tuple[int, str, str, dict[str, str] | None] | None:
        """(status, message, code, headers) for a request refused on its headers alone, or None."""
        d = self.door
        host = _header(scope, b"host")
        if d.hosts is not None and (host is None or host_name(host) not in d.hosts):
            return (421, f"Host {host!r} is not a name of this server; start it with --allow-host NAME to "
                    "answer that name", "host_not_allowed", None)
        if d.api_key and scope.get("path") not in OPEN_PATHS:
            auth = _header(scope, b"authorization") or ""
            given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(given.encode("utf-8", "replace"), d.api_key.encode()):
                return (401, "a valid API key is needed: send the header 'Authorization: Bearer KEY' (the openai "
                        "client's api_key)" if given or auth else "this server needs an API key: send the header "
                        "'Authorization: Bearer KEY' (the openai client's api_key)", "invalid_api_key",
                        {"WWW-Authenticate": "Bearer"})
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.strip().isdigit():
                return 400, f"Content-Length {length!r} is not a number of bytes", "invalid_length", None
            if int(length) > d.max_body:
                return self.too_large()
        return None

    def too_large(self) -> tuple[int, str, str, None]:
        kb = self.door.max_body // 1024
        return (413, f"the request body is larger than this server's limit of {kb} KiB; send less, or start the "
                "server with a larger --max-body-kb", "request_too_large", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracked = _Started(send)
        try:
            await self._http(scope, receive, tracked)
        except asyncio.CancelledError:  # the shutdown's grace ran out on it (a body that never came, a slow reader):
            if not tracked.started:  # uvicorn says so in one line; the request gets its 503, not a traceback
                await send_error(send, 503, "the server is shutting down; retry later (against its restart)",
                                 "shutting_down", {"Retry-After": "5"}, "server_busy")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = self.refusal(scope)
        if refused:
            status, msg, code, headers = refused
            await send_error(send, status, msg, code, headers)
            return
        body = bytearray()
        while True:  # read the body, at most max_body bytes of it
            m = await receive()
            if m["type"] == "http.disconnect":
                return
            body += m.get("body", b"")
            if len(body) > self.door.max_body:
                await send_error(send, *self.too_large())
                return
            if not m.get("more_body", False):
                break
        await self._app(scope, _replay(bytes(body), receive), send)

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracked = _Started(send)
        try:
            await self.app(scope, receive, tracked)
        except Exception as e:  # noqa: BLE001 - one line and a JSON 500, never a traceback or a plain-text 500
            self.log(f"bmoe serve: internal error on {scope.get('method')} {scope.get('path')}: "
                     f"{type(e).__name__}: {e}".encode("utf-8", "backslashreplace").decode())
            if not tracked.started:
                await send_error(send, 500, f"internal error: {type(e).__name__}", "internal_error",
                                 type_="server_error", close=False)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then the connection's own messages (a disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again
