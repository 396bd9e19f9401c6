"""`bmoe serve` against hostile input, second round (issue 36), each on a real server process on loopback with a
real HTTP client: a prompt that cannot fit is refused before it is tokenized; tokenizing waits in the queue, in a
child process that a client's leaving, --tokenize-timeout or the shutdown kills, while /health answers within
100 ms; SIGTERM at every point (load, tokenizing, prefill, decode) exits within 2 s with no C++ exception and no
traceback; a model file truncated under the plain mmap server answers the request in flight before exit 4.
Timing asserts are the issue's own bounds; everything else waits generously (a busy machine passes)."""

from __future__ import annotations

import json
import os
import re
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
from tests.helpers.load import slowdown
from tests.helpers.serve import Server

pytestmark = pytest.mark.engine

STREAM = ("--moe-stream", "--cache-mb", "1")
BIG_CTX = ("-c", "16384")
CRASH = ("Traceback", "terminate called", "std::", "CancelledError", "Aborted")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("hostile") / "m.gguf", ModelSpec(seed=15))[0]


@pytest.fixture(scope="module")
def big(model, tmp_path_factory):
    """A server whose largest accepted prompt takes seconds to tokenize: 16384 tokens of context, one waiting."""
    s = Server(model, tmp_path_factory.mktemp("big"), *BIG_CTX, "--queue", "1", "--tokenize-timeout", "120")
    yield s
    assert s.stop() == 0
    assert not any(c in s.log.read_text() for c in CRASH), s.log.read_text()


def _wait(cond, timeout: float, step: float = 0.02):
    end = time.monotonic() + timeout
    while not (v := cond()) and time.monotonic() < end:
        time.sleep(step)
    return v


def _longest(s: Server) -> int:
    """The vocabulary's longest token in bytes, as the server's refusal of a hopeless prompt names it."""
    r = s.http.post("/v1/completions", json={"prompt": "x" * 500_000, "max_tokens": 1})
    return int(re.search(r"longest token is (\d+) bytes", r.json()["error"]["message"]).group(1))


def _largest(s: Server, n_ctx: int) -> str:
    """The largest prompt the size check lets through, of the text slowest to tokenize (a byte token per byte)."""
    return "\n" * ((n_ctx - 1) * _longest(s))


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _send(s: Server, body: dict) -> socket.socket:
    """A request sent on a raw connection, its answer not read."""
    data = json.dumps(body).encode()
    c = socket.create_connection((s.host, int(s.port)))
    c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return c


def _in_thread(url: str, body: dict, stream: bool = False) -> threading.Thread:
    got: list[httpx.Response | str] = []

    def client() -> None:
        try:
            if stream:
                with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=300) as r:
                    got.append(r.read().decode())
            else:
                got.append(httpx.post(url + "/v1/completions", json=body, timeout=300))
        except httpx.HTTPError as e:
            got.append(f"no response: {type(e).__name__}")

    t = threading.Thread(target=client)
    t.got = got  # type: ignore[attr-defined]
    t.start()
    return t


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(model, tmp_path):
    s = Server(model, tmp_path, "-c", "4096")  # the default body limit, 1 MiB
    try:
        text = "é" * 450_000  # 900 KB: llama.cpp takes minutes to tokenize it (a byte token per byte)
        for path, body in (("/v1/completions", {"prompt": text, "max_tokens": 3}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": text}]})):
            t0 = time.monotonic()
            r = s.http.post(path, content=json.dumps(body, ensure_ascii=False).encode(),
                            headers={"content-type": "application/json"})
            took = time.monotonic() - t0
            err = r.json()["error"]
            assert r.status_code == 400 and err["code"] == "context_length_exceeded", r.text
            assert "900000 bytes" in err["message"] and "longest token is" in err["message"], err
            print(f"\n{path}: 900 KB prompt refused in {took * 1e3:.0f} ms")
            assert took < 5, took  # not tokenized (that takes ~40 s here)
        ok = s.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    finally:
        assert s.stop() == 0


def test_health_answers_within_100_ms_while_the_largest_accepted_prompt_is_tokenized(big):
    prompt = _largest(big, 16384)
    t = _in_thread(big.url, {"prompt": prompt, "max_tokens": 1})
    assert _wait(lambda: big.health()["running_phase"] == "tokenizing", 300)
    lat = []
    while t.is_alive():
        t0 = time.monotonic()
        h = big.health()
        lat.append(time.monotonic() - t0)
        if h["running_phase"] != "tokenizing":
            break
        time.sleep(0.02)
    t.join(timeout=120)
    r = t.got[0]  # type: ignore[attr-defined]
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text  # tokenized
    lat.sort()
    p90 = lat[int(0.9 * (len(lat) - 1))]
    print(f"\n/health while {len(prompt)} bytes were tokenized: {len(lat)} probes, median "
          f"{lat[len(lat) // 2] * 1e3:.1f} ms, p90 {p90 * 1e3:.1f} ms, max {lat[-1] * 1e3:.1f} ms")
    assert len(lat) >= 5, "the tokenizing was too short to probe"
    assert p90 < 0.1 and lat[-1] < 1.0, lat


def test_tokenizing_waits_in_the_queue_and_a_client_that_leaves_stops_it(big):
    before = big.health()
    prompt = _largest(big, 16384)
    first = _send(big, {"prompt": prompt, "max_tokens": 1})
    assert _wait(lambda: big.health()["running_phase"] == "tokenizing", 300)
    second = _send(big, {"prompt": prompt, "max_tokens": 1})
    assert _wait(lambda: big.health()["waiting"] == 1, 120), big.health()
    kids = _wait(lambda: _children(big.p.pid), 60)
    assert len(kids) == 1, kids  # one prompt tokenized at a time, in its own process
    r = big.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})  # --queue 1: full
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full", r.text
    assert big.health()["refused"] == before["refused"] + 1
    first.close()
    second.close()
    t0 = time.monotonic()
    h = _wait(lambda: (x := big.health())["running"] == 0 and x["waiting"] == 0 and x, 120)
    took = time.monotonic() - t0
    assert h and h["cancelled"] == before["cancelled"] + 2, big.health()
    assert _wait(lambda: not os.path.exists(f"/proc/{kids[0]}"), 60), "the tokenizing went on after its client left"
    print(f"\ntwo clients gone: both cancelled and the tokenizer killed {took:.2f} s later")
    ok = big.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_tokenizing_longer_than_the_timeout_is_refused(model, tmp_path):
    s = Server(model, tmp_path, *BIG_CTX, "--tokenize-timeout", "0.3")
    try:
        t0 = time.monotonic()
        r = s.http.post("/v1/completions", json={"prompt": _largest(s, 16384), "max_tokens": 1})
        took = time.monotonic() - t0
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "prompt_too_slow" and "0.3 s" in err["message"], r.text
        assert _wait(lambda: not _children(s.p.pid), 60)
        print(f"\ntokenize timeout 0.3 s: refused after {took:.2f} s")
        assert took < 10, took
        assert s.http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    finally:
        assert s.stop() == 0


def _start_load(model: Path, tmp: Path) -> tuple[subprocess.Popen, Path]:
    log = tmp / "load.err"
    with log.open("w") as err:
        p = subprocess.Popen([sys.executable, "-m", "harness.engine.cli", "serve", "-m", str(model), "--port", "0"],
                             stdout=subprocess.DEVNULL, stderr=err)
    time.sleep(0.5)  # importing, re-executing with the mmap shim, loading
    return p, log


@pytest.mark.parametrize("point", ["load", "tokenizing", "prefill", "prefill-streamed", "decode-streamed"])
def test_sigterm_at_every_point_exits_within_2_s(model, tmp_path, point):
    if point == "load":
        p, log = _start_load(model, tmp_path)
        t = kid = None
    else:
        flags = STREAM if point.endswith("streamed") else ()
        s = Server(model, tmp_path, *flags, *(BIG_CTX if point == "tokenizing" else ("-c", "4096")))
        p, log = s.p, s.log
        body = {"prompt": "go", "max_tokens": 4000}
        if point == "tokenizing":
            body = {"prompt": _largest(s, 16384), "max_tokens": 1}
        elif point.startswith("prefill"):
            body = {"prompt": "the cat " * 640, "max_tokens": 50}  # ~3840 tokens: seconds of prefill here
        t = _in_thread(s.url, body)
        phase = {"tokenizing": lambda h: h["running_phase"] == "tokenizing",
                 "decode-streamed": lambda h: h["running_tokens"] >= 1}.get(point, lambda h: h["running_phase"] ==
                                                                             "generating")
        assert _wait(lambda: phase(s.health()), 300), s.health()
        time.sleep(0.2)
        h = s.health()
        if point.startswith("prefill"):
            assert h["running_phase"] == "generating" and h["running_tokens"] == 0, h  # still in the prefill
        kid = _wait(lambda: _children(p.pid), 60)[0] if point == "tokenizing" else None
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=30)
    finally:
        p.kill()
    took = time.monotonic() - t0
    err = log.read_text()
    print(f"\nSIGTERM at {point}: exit {rc} {took:.2f} s after the signal")
    assert not any(c in err for c in CRASH), err
    if t is None:  # before the server listens: the signal's default action (harness.engine.serve.process)
        assert rc == (0 if "serving" in err else -signal.SIGTERM), (rc, err)
    else:
        assert rc == 0, (rc, err)
        t.join(timeout=30)
        r = t.got[0]  # type: ignore[attr-defined]
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
    assert took < 2.0 * slowdown(), took  # 2 s on an idle machine, scaled by how busy this one is now
    if kid is not None:
        assert _wait(lambda: not os.path.exists(f"/proc/{kid}"), 60), "the tokenizer outlived its server"


@pytest.mark.parametrize("watch", ["compiled", "thread"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_model_truncated_under_the_plain_mmap_server_answers_the_request_in_flight(tmp_path, stream, watch):
    """With the compiled SIGBUS handler, and with the pure-Python watcher (BMOE_MODEL_WATCH=thread, as without
    the compiled helper): the request in flight gets its JSON 500, then exit 4."""
    m = tmp_path / "m.gguf"
    make_model(m, ModelSpec(seed=16))
    env = {"BMOE_MODEL_WATCH": watch} if watch == "thread" else None
    s = Server(m, tmp_path, "-c", "4096", env=env)  # plain mmap: the truncation is a SIGBUS in llama.cpp's threads
    t = _in_thread(s.url, {"prompt": "go", "max_tokens": 4000}, stream)
    assert _wait(lambda: s.health()["running_tokens"] >= 1, 300)
    os.truncate(m, m.stat().st_size // 3)
    try:
        rc = s.p.wait(timeout=30)
    finally:
        s.p.kill()
    t.join(timeout=30)
    err = s.stderr()
    assert rc == 4, (rc, err)  # the documented status: a model file changed under the engine
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"bmoe: error: {m} changed size under the running engine"), err
    assert not any(c in err for c in CRASH), err
    got = t.got[0]  # type: ignore[attr-defined]
    if stream:
        assert isinstance(got, str) and '"type": "server_error"' in got and str(m) in got, got
        assert got.rstrip().endswith("data: [DONE]"), got
    else:
        assert not isinstance(got, str), got
        e = got.json()["error"]
        assert got.status_code == 500 and e["code"] == "engine_failure" and str(m) in e["message"], got.text


def test_sigterm_with_clients_whose_bodies_never_come_exits_within_2_s(model, tmp_path):
    s = Server(model, tmp_path)
    slow = []
    for _ in range(3):  # each announces a body and sends one byte of it
        c = socket.create_connection((s.host, int(s.port)))
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        slow.append(c)
    time.sleep(0.3)
    t0 = time.monotonic()
    s.p.send_signal(signal.SIGTERM)
    try:
        rc = s.p.wait(timeout=30)
    finally:
        s.p.kill()
    took = time.monotonic() - t0
    err = s.stderr()
    print(f"\nSIGTERM with 3 stalled bodies: exit {rc} {took:.2f} s after the signal")
    assert rc == 0 and took < 2.0 * slowdown(), (rc, took, err)
    assert not any(c in err for c in CRASH), err
    for c in slow:
        c.settimeout(5)
        got = b""
        while chunk := c.recv(65536):  # the answer, then the close
            got += chunk
        assert got.startswith(b"HTTP/1.1 503") and b"shutting_down" in got, got
        c.close()
