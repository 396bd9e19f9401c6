"""`bmoe serve`'s own flags and its door (parsed by harness.engine.cli.split into serve.subcommands.ServeFlags;
harness.engine.serve.guard), pure: the body limit, the API key (flag or BMOE_API_KEY), the Host allow-list and how
a Host header is read; the guard as an ASGI app over a tiny app of its own (a chunked body cut at the limit, an
exception turned into a JSON 500)."""

from __future__ import annotations

import asyncio
import json

import pytest

from harness.engine.cli import split
from harness.engine.serve.guard import Guard, door_of, host_name, is_loopback
from harness.engine.serve.subcommands import ServeFlags
from harness.errors import UserError


def test_defaults_and_the_key_from_the_environment():
    _, rest, f = split(["serve", "-m", "x.gguf"])
    assert rest == ["-m", "x.gguf"] and f == ServeFlags() and f.max_body_kb == 1024 and f.api_key == ""
    assert split(["serve"], api_key="k1")[2].api_key == "k1"
    assert split(["serve", "--api-key", "k2"], api_key="k1")[2].api_key == "k2"  # the flag wins
    f = split(["serve", "--max-body-kb", "64", "--allow-host", "a.test", "--allow-host", "b.test"])[2]
    assert f.max_body_kb == 64 and f.allow_hosts == ("a.test", "b.test")


@pytest.mark.parametrize("argv, says", [
    (["--max-body-kb", "0"], "--max-body-kb must be >= 1"),
    (["--api-key", ""], "--api-key is empty"),
    (["--api-key", "has space"], "printable ASCII"),
    (["--allow-host", " "], "--allow-host needs a name"),
])
def test_bad_flags_are_one_line(argv, says):
    with pytest.raises(UserError, match=says):
        split(["serve", *argv])


def test_host_names_and_the_allow_list():
    assert [host_name(h) for h in ("LocalHost:8080", "[::1]:80", "127.0.0.1", "example.com.", "[::1]")] == \
        ["localhost", "::1", "127.0.0.1", "example.com", "::1"]
    d = door_of("127.0.0.1", (), 1024, "")
    assert d.max_body == 1 << 20 and d.hosts == {"localhost", "127.0.0.1", "::1"}
    assert door_of("10.0.0.5", ("Box.Lan",), 8, "").hosts == {"localhost", "127.0.0.1", "::1", "10.0.0.5", "box.lan"}
    assert door_of("0.0.0.0", (), 8, "").hosts == {"localhost", "127.0.0.1", "::1"}  # a wildcard names no host
    assert door_of("0.0.0.0", ("*",), 8, "").hosts is None
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("0.0.0.0")


def _call(guard: Guard, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[list[dict], int]:
    """Runs one HTTP request through the guard (ASGI); the messages sent back and how many chunks were read."""
    read = 0
    sent: list[dict] = []

    async def receive() -> dict:
        nonlocal read
        read += 1
        if read <= len(chunks):
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(m: dict) -> None:
        sent.append(m)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": headers}
    asyncio.run(guard(scope, receive, send))
    return sent, read


def test_the_guard_stops_reading_a_chunked_body_past_the_limit_and_turns_any_escape_into_json():
    got: list[bytes] = []

    async def app(scope, receive, send) -> None:
        got.append((await receive())["body"])
        raise RuntimeError("boom \ud800")

    lines: list[str] = []
    g = Guard(app, door_of("127.0.0.1", (), 256, ""), log=lines.append)
    host = [(b"host", b"127.0.0.1:8080")]
    sent, read = _call(g, host, [b"x" * 65536] * 100)  # 6.5 MB, chunked: refused after 257 KiB
    assert read == 5 and sent[0]["status"] == 413 and not got
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"
    sent, read = _call(g, host + [(b"content-length", b"999999999")], [b"x"])  # declared: nothing read
    assert read == 0 and sent[0]["status"] == 413
    sent, read = _call(g, host, [b'{"a":', b" 1}"])  # fits: the app gets it whole, raises: a JSON 500, one line
    assert got == [b'{"a": 1}'] and sent[0]["status"] == 500
    assert json.loads(sent[1]["body"])["error"]["code"] == "internal_error"
    assert len(lines) == 1 and "RuntimeError: boom \\ud800" in lines[0]
