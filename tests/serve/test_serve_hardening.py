"""`bmoe serve` fit to leave running (issue 23, items 6-13), each on a real server process on loopback: oversized
bodies refused before they are read, no KV prefix shared across conversations, the Host allow-list and the API key,
a disconnect cancels a whole (non-streamed) reply, JSON errors for every bad body, SIGTERM and a second signal,
an engine failure exits, listen failures are one line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.serve import Server

openai = pytest.importorskip("openai", reason="openai is in the dev extra (pip install -e '.[dev]')")
pytestmark = pytest.mark.engine

FLAGS = ("--moe-stream", "--cache-mb", "1")
LONG = {"model": "m", "prompt": "go", "max_tokens": 4000}  # ~80 s of generation on this machine, if not stopped


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hard") / "m.gguf", ModelSpec(seed=15))[0]


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    s = Server(model, tmp_path_factory.mktemp("srv"), *FLAGS, "-c", "4096")  # the default body limit, 1 MiB
    yield s
    assert s.stop() == 0
    assert "Traceback" not in s.log.read_text()


def _reply(sock: socket.socket, timeout: float = 10) -> tuple[int, dict]:
    """The status and JSON body of the response on a raw socket."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    return int(head.split()[1]), json.loads(body)


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 1 << 30


def _wait(cond, timeout: float, step: float = 0.02):
    end = time.monotonic() + timeout
    while not (v := cond()) and time.monotonic() < end:
        time.sleep(step)
    return v


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_oversized_bodies_get_413_before_they_are_read_and_health_goes_on(server):
    peak0 = _peak_rss_mib(server.p.pid)
    # declared: 20 MB announced, not one byte of it sent; the 413 comes at once
    with socket.create_connection((server.host, int(server.port))) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 20000000\r\n\r\n")
        status, body = _reply(s)
        assert status == 413 and body["error"]["code"] == "request_too_large", body
        assert time.monotonic() - t0 < 2
    # chunked (no length): refused once past the limit; most of the 20 MB is never sent, /health answers meanwhile
    with socket.create_connection((server.host, int(server.port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Transfer-Encoding: chunked\r\n\r\n")
        sent, piece = 0, b"%x\r\n%s\r\n" % (65536, b"x" * 65536)
        s.settimeout(5)
        try:
            while sent < 20_000_000:
                s.sendall(piece)
                sent += 65536
                if sent % (1 << 20) == 0:
                    t0 = time.monotonic()
                    assert server.health()["status"] == "ok" and time.monotonic() - t0 < 1
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the server answered and closed: it stopped reading
        assert sent < 10_000_000, f"the server read {sent} bytes of an oversized chunked body"
        status, body = _reply(s)
        assert status == 413 and body["error"]["code"] == "request_too_large", body
    grew = _peak_rss_mib(server.p.pid) - peak0
    print(f"\noversized: chunked body cut after {sent / 1e6:.1f} MB sent; server peak RSS grew {grew:.1f} MiB")
    assert grew < 16, f"the server's peak RSS grew {grew:.1f} MiB while refusing 20 MB bodies"
    # a body under the limit is read and judged as usual (too long for the context here)
    r = server.http.post("/v1/completions", json={"model": "m", "prompt": "word " * 40000, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert server.health()["status"] == "ok"


def test_kv_prefix_is_reused_only_within_the_same_conversation(server):
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    secret = [{"role": "system", "content": "the api key is K7Q2; never tell it"},
              {"role": "user", "content": "What is the weather like?"}]
    a1 = c.chat.completions.create(model="m", messages=secret, max_tokens=4, user="alice-3f9c1e")
    turn2 = secret + [{"role": "assistant", "content": a1.choices[0].message.content},
                      {"role": "user", "content": "And tomorrow?"}]
    a2 = c.chat.completions.create(model="m", messages=turn2, max_tokens=4, user="alice-3f9c1e")
    assert a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens  # her own turn: reused
    # another client guessing her prompt, under its own name or none: nothing reused, nothing to learn
    for user in ("bob", None):
        kw = {"user": user} if user else {}
        b = c.chat.completions.create(model="m", messages=turn2, max_tokens=4, **kw)
        assert b.usage.prompt_tokens_details.cached_tokens == 0 and b.model_extra["bmoe"]["n_reused"] == 0, user
        assert b.model_extra["bmoe"]["summary"]["n_prompt"] == b.usage.prompt_tokens  # all of it prefilled
    # and a guess of her prefix under her conversation's name after another's request reuses nothing either
    a3 = c.chat.completions.create(model="m", messages=turn2, max_tokens=4, user="alice-3f9c1e")
    assert a3.usage.prompt_tokens_details.cached_tokens == 0


def test_host_allow_list_api_key_and_the_open_health(model, tmp_path):
    s = Server(model, tmp_path, *FLAGS, "--allow-host", "bmoe.test", "--max-body-kb", "8",
               env={"BMOE_API_KEY": "k-123"})
    try:
        h, url = s.http, "/v1/models"
        good = {"Authorization": "Bearer k-123"}
        assert h.get(url, headers=good).status_code == 200
        assert h.get(url, headers={**good, "Host": f"localhost:{s.port}"}).status_code == 200
        assert h.get(url, headers={**good, "Host": "bmoe.test"}).status_code == 200
        for host in ("rebound.example.com", "127.0.0.1.nip.io", "evil.test:80"):  # DNS rebinding
            r = h.get(url, headers={**good, "Host": host})
            assert r.status_code == 421 and r.json()["error"]["code"] == "host_not_allowed", (host, r.text)
        r = h.get("/health", headers={"Host": "rebound.example.com"})
        assert r.status_code == 421
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "k-123"}):
            r = h.get(url, headers=auth)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (auth, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
        r = h.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert r.status_code == 401
        r = h.post("/v1/completions", json={"prompt": "x" * 9000, "max_tokens": 1}, headers=good)  # --max-body-kb 8
        assert r.status_code == 413 and "8 KiB" in r.json()["error"]["message"], r.text
        assert h.get("/health").json()["status"] == "ok" and h.get("/").status_code == 200  # open: probe, page
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="k-123", max_retries=0, timeout=60)
        assert c.completions.create(model="m", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.url + "/v1", api_key="nope", max_retries=0).models.list()
        assert "API key required" in s.stderr() and "warning" not in s.stderr()
    finally:
        assert s.stop() == 0


def test_listening_beyond_loopback_without_a_key_warns(capfd):
    from harness.engine.serve.process import listen
    from harness.engine.serve.subcommands import ServeFlags

    listen(ServeFlags(host="0.0.0.0", port=0)).close()  # bound, never listening: nothing is exposed
    assert "warning: listening on 0.0.0.0 without an API key" in capfd.readouterr().err
    listen(ServeFlags(host="0.0.0.0", port=0, api_key="k")).close()
    listen(ServeFlags(host="127.0.0.1", port=0)).close()
    assert capfd.readouterr().err == ""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_client_that_goes_away_is_cancelled_within_a_token(server, stream):
    before = server.health()
    with socket.create_connection((server.host, int(server.port))) as c:
        body = json.dumps({**LONG, "stream": stream}).encode()
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        assert _wait(lambda: server.health()["running_tokens"] >= 20, 30)
        at_close = server.health()["running_tokens"]
    gone = time.monotonic()  # the client has gone away, its reply half-made
    h = _wait(lambda: (x := server.health())["cancelled"] > before["cancelled"] and x, 30)
    took = time.monotonic() - gone
    assert h and h["last"]["finish"] == "cancelled" and h["running"] == 0, server.health()
    after = h["last"]["tokens"] - at_close
    print(f"\ndisconnect ({'streamed' if stream else 'whole'}): {after} tokens and {took:.2f} s after the client "
          f"left (of {h['last']['tokens']})")
    # the tokens are the bound; the seconds only catch a cancel that never comes (a loaded machine took 1.4 s once)
    assert after <= 5 and took < 10, f"{after} tokens ({took:.2f} s) generated after the client left"


@pytest.mark.parametrize("body", [
    '{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    '{"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
    '{"model": "m\\ud800", "messages": [{"role": "user", "content": "hi"}]}',
    '{"model": "m", "user": "\\udc80", "messages": [{"role": "user", "content": "hi"}]}',
    '{"model": "m", "messages": [{"role": "robot", "content": "hi"}]}',
    '{"model": "m", "messages": [{"role": "user", "content": 7}]}',
    '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
    '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000000000000000000000}',
    '{"model": "m", "messages": "hi"}', '"just a string"', "null", "", "[" * 100000 + "]" * 100000,
    b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
])
def test_every_bad_chat_body_is_a_4xx_json_error(server, body):
    r = server.http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    assert r.json()["error"]["message"]


def test_a_lone_surrogate_in_a_prompt_is_a_400_naming_it(server):
    r = server.http.post("/v1/completions", content='{"prompt": "x\\ud83d", "max_tokens": 2}',
                         headers={"content-type": "application/json"})
    assert r.status_code == 400 and "lone surrogate" in r.json()["error"]["message"], r.text
    assert "prompt" in r.json()["error"]["message"]


def _start_long(s: Server) -> threading.Thread:
    got: list[httpx.Response] = []

    def client() -> None:
        try:
            got.append(httpx.post(s.url + "/v1/completions", json=LONG, timeout=120))
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=client)
    t.got = got  # type: ignore[attr-defined]
    t.start()
    assert _wait(lambda: s.health()["running"] == 1, 20)
    time.sleep(0.3)
    return t


def test_sigterm_cancels_the_generation_and_exits_in_bounded_time(model, tmp_path):
    s = Server(model, tmp_path, *FLAGS, "-c", "4096")
    t = _start_long(s)
    t0 = time.monotonic()
    s.p.send_signal(signal.SIGTERM)
    try:
        rc = s.p.wait(timeout=60)
    finally:
        s.p.kill()
    took = time.monotonic() - t0
    t.join(timeout=10)
    print(f"\nsigterm: exit {rc} {took:.2f} s after the signal")
    assert rc == 0 and took < 12, (rc, took)  # the server's bound is 10 s plus a token; the rest is interpreter exit
    r = t.got[0]  # type: ignore[attr-defined]
    assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
    assert "Traceback" not in s.stderr()


def test_a_second_signal_exits_now(model, tmp_path):
    s = Server(model, tmp_path, *FLAGS)
    with socket.create_connection((s.host, int(s.port))) as slow:  # a body that never comes: shutdown waits on it
        slow.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        s.p.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert s.p.poll() is None  # the first signal waits for open connections (up to GRACE_S, 0.4 s)
        t0 = time.monotonic()
        s.p.send_signal(signal.SIGTERM)
        try:
            rc = s.p.wait(timeout=10)
        finally:
            s.p.kill()
        assert time.monotonic() - t0 < 1.0 and rc == 128 + signal.SIGTERM, rc
    assert "SIGTERM again: exiting now" in s.stderr()


def test_an_engine_failure_exits_non_zero_with_one_line(tmp_path):
    m = make_model(tmp_path / "m.gguf", ModelSpec(seed=16))[0]
    s = Server(m, tmp_path, *FLAGS, "-c", "4096")
    t = _start_long(s)
    os.truncate(m, m.stat().st_size // 3)  # the model file cut under the running server
    try:
        rc = s.p.wait(timeout=60)
    finally:
        s.p.kill()
    t.join(timeout=10)
    err = s.stderr()
    assert rc == 3, (rc, err)  # --moe-stream: the truncation is seen by an expert read
    last = err.strip().splitlines()[-1]
    assert last.startswith("bmoe: error: bmoe serve: engine failure:") and "truncated" in last, err
    assert "Traceback" not in err
    got = t.got[0]  # type: ignore[attr-defined]
    assert got.status_code == 500 and "engine failure" in got.json()["error"]["message"], got.text


def test_listen_failures_are_one_line(model, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for host, port_, says in (("127.0.0.1", port, "Address already in use"),
                                  ("no-such-host.invalid", 8080, "does not resolve")):
            r = subprocess.run([sys.executable, "-m", "harness.engine.cli", "serve", "-m", str(model), *FLAGS,
                                "--host", host, "--port", str(port_)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 2 and says in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
