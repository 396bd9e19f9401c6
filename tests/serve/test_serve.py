"""`bmoe serve`, a real server process on loopback, with the official `openai` client as the client: chat and
text completions, streamed (SSE) and whole, usage and bmoe telemetry in every response; greedy replies
identical to the CLI's for the same prompt; 4xx JSON errors for bad input; a full queue answers 503 with
Retry-After; a client that disconnects cancels its generation; a bounded load test."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe
from tests.helpers.serve import Server

openai = pytest.importorskip("openai", reason="openai is in the dev extra (pip install -e '.[dev]')")
pytestmark = pytest.mark.engine

FLAGS = ("--moe-stream", "--cache-mb", "1")
N = 16
PROMPTS = ["The expert cache keeps hot experts near.", "Flash is slow, RAM is small.", "Route me.", "One more."]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("serve") / "m.gguf", ModelSpec(seed=13))[0]


@pytest.fixture(scope="module")
def cli_tokens(model, tmp_path_factory):
    """The CLI's greedy tokens for a prompt (`--chatml` for a chat message), same engine flags."""
    d = tmp_path_factory.mktemp("cli")
    memo: dict[tuple[str, bool], list[int]] = {}

    def get(prompt: str, chat: bool = False) -> list[int]:
        if (prompt, chat) not in memo:
            r = bmoe(model, *FLAGS, *(("--chatml",) if chat else ()), n=N, tmp=d, prompt=prompt)
            assert r.rc == 0, r.stderr
            memo[prompt, chat] = r.tokens
        return memo[prompt, chat]

    return get


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    # bit-exact replies (== the CLI's) need each prompt prefilled whole; the KV reuse is tested below
    s = Server(model, tmp_path_factory.mktemp("srv"), *FLAGS, "--queue", "2", "--no-kv-reuse")
    yield s
    assert s.stop() == 0


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_openai_client_chat_and_completions_match_the_cli(server, cli_tokens):
    c = _client(server)
    assert [m.id for m in c.models.list().data] == ["m"]
    msg = [{"role": "user", "content": PROMPTS[0]}]
    r = c.chat.completions.create(model="m", messages=msg, max_tokens=N, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == N and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + N
    bm = r.model_extra["bmoe"]
    assert bm["token_ids"] == cli_tokens(PROMPTS[0], chat=True)
    assert bm["summary"]["n_decode"] == N and bm["summary"]["mib_read_per_token"] > 0 and bm["tok_s"] > 0
    # streamed: the same reply, chunk by chunk, each with telemetry; usage at the end
    chunks = list(c.chat.completions.create(model="m", messages=msg, max_tokens=N, stream=True))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == r.choices[0].message.content
    assert sum(1 for ch in chunks if ch.choices and (ch.model_extra or {}).get("bmoe")) == N
    assert chunks[-1].usage.completion_tokens == N
    tele = [ch.model_extra["bmoe"] for ch in chunks if ch.choices and (ch.model_extra or {}).get("bmoe")]
    assert all(t["wall_ms"] > 0 and t["read_mb"] > 0 and t["rss_mib"] > 0 for t in tele)
    # text completions: the raw prompt, as `bmoe -p`
    t = c.completions.create(model="m", prompt=PROMPTS[1], max_tokens=N, temperature=0)
    assert t.model_extra["bmoe"]["token_ids"] == cli_tokens(PROMPTS[1]) and t.usage.completion_tokens == N
    parts = list(c.completions.create(model="m", prompt=PROMPTS[1], max_tokens=N, stream=True))
    assert "".join(p.choices[0].text for p in parts if p.choices) == t.choices[0].text
    assert parts[-1].usage.completion_tokens == N


def test_bad_requests_get_a_4xx_json_error_and_the_server_goes_on(server):
    h = server.http
    for body, headers in (("{not json", {"content-type": "application/json"}), ("[1,2]", {})):
        r = h.post("/v1/chat/completions", content=body, headers=headers)
        assert r.status_code == 400 and r.json()["error"]["message"], r.text
    assert h.post("/v1/chat/completions", json={"model": "m", "messages": []}).status_code == 400
    assert h.post("/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400
    assert h.post("/v1/completions", json={"prompt": "x", "n": 2}).json()["error"]["code"] == "unsupported"
    assert h.get("/v1/nothing").status_code == 404
    c = _client(server)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="m", prompt="long " * 400, max_tokens=8)
    assert e.value.body["code"] == "context_length_exceeded"
    assert server.health()["status"] == "ok"
    assert c.completions.create(model="m", prompt="still here", max_tokens=2).usage.completion_tokens == 2


def test_full_queue_is_503_and_a_disconnect_cancels(model, tmp_path):
    s = Server(model, tmp_path, *FLAGS, "--queue", "0", "-c", "2048")
    try:
        body = {"model": "m", "prompt": "go", "max_tokens": 2000, "stream": True}
        with s.http.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            while '"step"' not in next(lines):  # the generation is under way
                pass
            busy = s.http.post("/v1/completions", json={"model": "m", "prompt": "me too", "max_tokens": 2})
            assert busy.status_code == 503 and int(busy.headers["retry-after"]) >= 1
            assert busy.json()["error"]["code"] == "queue_full"
        # the stream was closed: the server stops generating for it
        end = time.monotonic() + 30
        while (h := s.health())["cancelled"] < 1 and time.monotonic() < end:
            time.sleep(0.1)
        assert h["cancelled"] == 1 and h["last"]["finish"] == "cancelled" and h["last"]["tokens"] < 2000, h
        assert h["running"] == 0 and h["refused"] == 1
        ok = s.http.post("/v1/completions", json={"model": "m", "prompt": "go on", "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        # this server keeps the KV prefix (the default): a conversation's next turn reuses the one before
        msgs = [{"role": "user", "content": "Hi"}]
        conv = {"model": "m", "max_tokens": 4, "user": "conversation-1"}
        r1 = s.http.post("/v1/chat/completions", json={**conv, "messages": msgs})
        assert r1.status_code == 200, (r1.status_code, r1.text, s.health())  # CI once saw no "usage" here
        one = r1.json()
        msgs += [one["choices"][0]["message"], {"role": "user", "content": "Again"}]
        r2 = s.http.post("/v1/chat/completions", json={**conv, "messages": msgs})
        assert r2.status_code == 200, (r2.status_code, r2.text, s.health())
        two = r2.json()
        cached = two["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert one["usage"]["prompt_tokens"] <= cached < two["usage"]["prompt_tokens"], two["usage"]
    finally:
        assert s.stop() == 0


def test_load_concurrent_clients_answered_or_refused_nothing_lost(server, cli_tokens):
    before = server.health()
    n_clients = 8
    results: list[tuple[str, object]] = [("none", None)] * n_clients

    def client(i: int) -> None:
        c = _client(server)
        p = PROMPTS[i % len(PROMPTS)]
        try:
            r = c.completions.create(model="m", prompt=p, max_tokens=N, temperature=0)
            results[i] = ("ok", (p, r.model_extra["bmoe"]["token_ids"]))
        except openai.APIStatusError as e:
            results[i] = ("refused" if e.status_code == 503 and e.response.headers.get("retry-after") else "bad",
                          e.status_code)
        except Exception as e:  # noqa: BLE001 - recorded, then failed on below
            results[i] = ("bad", repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    kinds = [k for k, _ in results]
    assert set(kinds) <= {"ok", "refused"}, results
    ok = [v for k, v in results if k == "ok"]
    assert len(ok) >= 3  # the running one and the two the queue holds, at least
    for p, toks in ok:
        assert toks == cli_tokens(p), p
    after = server.health()
    assert after["served"] - before["served"] == len(ok)
    assert after["refused"] - before["refused"] == kinds.count("refused")
    assert after["running"] == 0 and after["waiting"] == 0
