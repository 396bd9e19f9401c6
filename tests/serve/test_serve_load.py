"""A bounded load test of `bmoe serve` on loopback: concurrent clients (whole and streamed), clients that go away
mid-reply, oversized bodies (declared and chunked) and 1 MB prompts just under the limit, all at once, while a
probe asks /health every 50 ms and each answer must come within 100 ms. Every client is answered (or refused with
503 and Retry-After), nothing is left running, and the server stays up."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.serve import Server

pytestmark = pytest.mark.engine

HEALTH_MS = 100.0
DEADLINE_S = 120.0
# The probe is its own process, so that the clients' threads here do not delay its timing (one GIL): it asks
# /health every 50 ms until its stdin closes, then prints, per answer, its status, its milliseconds, and the
# milliseconds the server's event-loop thread and the probe itself spent runnable but not running (waiting for a
# CPU, /proc/<tid>/schedstat): on this shared 2-core machine that wait is the scheduler's, not the server's doing.
PROBE = """
import http.client, json, sys, threading, time
host, port, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
me = threading.get_native_id()
def waited():
    return sum(int(open(f"/proc/{p}/task/{t}/schedstat").read().split()[1]) for p, t in ((pid, pid), ("self", me)))
c, out = http.client.HTTPConnection(host, port, timeout=5), []
while not done.is_set():
    w0, t0 = waited(), time.perf_counter()
    try:
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        status = r.status
    except OSError:  # no answer within 5 s: recorded as status 0
        c.close()
        c, status = http.client.HTTPConnection(host, port, timeout=5), 0
    out.append((status, 1000 * (time.perf_counter() - t0), (waited() - w0) / 1e6))
    time.sleep(0.05)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("load") / "m.gguf", ModelSpec(seed=17))[0]


def _oversized(s: Server, chunked: bool) -> int:
    """Sends a 20 MB request (a valid one: a 20 MB prompt), its length declared or chunked; the response status."""
    body = b'{"model": "m", "prompt": "' + b"x" * 20_000_000 + b'", "max_tokens": 2}'
    pieces = [body[i:i + 65536] for i in range(0, len(body), 65536)]
    with socket.create_connection((s.host, int(s.port)), timeout=30) as c:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        c.sendall(head + (b"Transfer-Encoding: chunked\r\n\r\n" if chunked else
                          b"Content-Length: %d\r\n\r\n" % len(body)))
        try:
            for p in pieces:
                c.sendall(b"%x\r\n%s\r\n" % (len(p), p) if chunked else p)
            if chunked:
                c.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused and closed: the rest is never sent
        data = b""
        try:
            while b"\r\n" not in data and (chunk := c.recv(4096)):
                data += chunk
        except OSError:
            pass
        return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else -1


def test_load_clients_disconnects_and_oversized_bodies_while_health_answers_fast(model, tmp_path):
    s = Server(model, tmp_path, "--moe-stream", "--cache-mb", "1", "-c", "2048", "--queue", "3")
    outcomes: list[tuple[str, object]] = []
    lock = threading.Lock()

    def note(kind: str, val: object) -> None:
        with lock:
            outcomes.append((kind, val))

    def client(i: int) -> None:
        body = {"model": "m", "prompt": f"client {i} says hello", "max_tokens": 16, "stream": i % 2 == 1}
        with httpx.Client(base_url=s.url, timeout=60) as h:
            for _ in range(2):
                while True:  # a full queue: retry, as a client told Retry-After would (sooner), until the deadline
                    r = h.post("/v1/completions", json=body)
                    if r.status_code != 503 or not r.headers.get("retry-after") or time.monotonic() > give_up:
                        break
                    note("refused", i)
                    time.sleep(0.25)
                if r.status_code == 200 and (not body["stream"] or "[DONE]" in r.text):
                    note("ok", i)
                else:
                    note("bad", (r.status_code, r.text[:200]))

    def leaver(i: int) -> None:
        body = {"model": "m", "prompt": "a long one", "max_tokens": 1500, "stream": i % 2 == 0}
        while time.monotonic() < give_up:  # until it gets in (a full queue answers 503 at once)
            try:
                if body["stream"]:
                    with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
                        if r.status_code == 200:
                            for line in r.iter_lines():
                                if '"step"' in line:
                                    break  # one token seen: go away
                            note("left", i)
                            return
                else:
                    r = httpx.post(s.url + "/v1/completions", json=body, timeout=1.0)
            except httpx.TimeoutException:  # waited or generated for 1 s: go away
                note("left", i)
                return
            if r.status_code != 503:
                note("bad", (r.status_code, r.text[:200]))
                return
            note("refused", i)
            time.sleep(0.25)

    def near_limit(i: int) -> None:  # a 1 MB prompt, just under the 1 MiB limit: read, tokenized, refused
        r = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "word " * 200_000, "max_tokens": 2},
                       timeout=60)
        ok = r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        note("long" if ok else "bad", (r.status_code, r.text[:200]))

    def big(i: int) -> None:
        status = _oversized(s, chunked=i % 2 == 0)
        note("413" if status == 413 else "bad", ("oversized", status))

    probe = subprocess.Popen([sys.executable, "-c", PROBE, s.host, s.port, str(s.p.pid)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    give_up = t0 + DEADLINE_S / 2
    threads = ([threading.Thread(target=client, args=(i,)) for i in range(6)]
               + [threading.Thread(target=leaver, args=(i,)) for i in range(3)]
               + [threading.Thread(target=big, args=(i,)) for i in range(4)]
               + [threading.Thread(target=near_limit, args=(i,)) for i in range(2)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, DEADLINE_S - (time.monotonic() - t0)))
    took = time.monotonic() - t0
    # the queue drains (the leavers' generations cancelled), then the probe stops
    end = time.monotonic() + 30
    while ((h := s.health())["running"] or h["waiting"]) and time.monotonic() < end:
        time.sleep(0.1)
    answers = json.loads(probe.communicate("", timeout=30)[0])
    lat_ms = [ms for _, ms, _ in answers]
    own_ms = [ms - cpu_wait for _, ms, cpu_wait in answers]  # the server's own part of each answer's time
    health_bad = [st for st, _, _ in answers if st != 200]
    try:
        assert not any(t.is_alive() for t in threads), f"clients still running after {DEADLINE_S} s"
        kinds = [k for k, _ in outcomes]
        print(f"\nload: {len(threads)} clients in {took:.1f} s, outcomes {sorted(set(kinds))} "
              f"{[kinds.count(k) for k in sorted(set(kinds))]}; /health x{len(lat_ms)}: median "
              f"{statistics.median(lat_ms):.1f} ms, max {max(lat_ms):.1f} ms, {sum(x >= HEALTH_MS for x in lat_ms)} "
              f">= {HEALTH_MS:g} ms; less the time waiting for a CPU: max {max(own_ms):.1f} ms")
        assert "bad" not in kinds, [v for k, v in outcomes if k == "bad"]
        assert kinds.count("413") == 4 and kinds.count("long") == 2 and kinds.count("left") == 3, outcomes
        assert kinds.count("ok") == 12, outcomes  # 6 clients x 2, each answered in the end
        assert h["running"] == 0 and h["waiting"] == 0 and h["status"] == "ok", h
        assert h["cancelled"] >= 1, h
        assert not health_bad and len(lat_ms) >= 20, (health_bad, len(lat_ms))
        slow = [(round(x, 1), round(y, 1)) for x, y in zip(lat_ms, own_ms, strict=True) if y >= HEALTH_MS]
        assert not slow, f"/health took >= {HEALTH_MS} ms (less CPU waits) {len(slow)} times of {len(lat_ms)}: {slow}"
    finally:
        assert s.stop() == 0
    assert "Traceback" not in s.log.read_text()
