"""`bmoe --session`: the JSON-lines protocol over one loaded engine. Gates: a three-turn session streamed ==
resident, and == a fresh process per turn given the same history (bit-exact with --no-kv-reuse; with the KV
prefix reused, the first turn); the KV prefix is reused (not recomputed);
the CSV's turn column counts turns; malformed or refused requests get an error reply and the session goes on;
cancel stops a generation and the next one runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.formats.metrics_csv import read_metrics
from harness.synth import ModelSpec, make_model
from tests.helpers.session import SessionProc, chat_turns

pytestmark = pytest.mark.engine

USERS = ["Name the expert cache.", "Why keep it warm?", "And across turns?"]
STREAM = ("--moe-stream", "--cache-mb", "1")  # 1 MiB holds 9 of the 32 experts: evictions every token


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("sess") / "m.gguf", ModelSpec(seed=11))[0]


def _fresh(model, d, *flags: str) -> dict:
    """A fresh process given the same history answers ..."""
    s = SessionProc(model, *flags)
    fresh = s.generate(d["messages"], n_predict=12)
    assert s.close() == 0
    assert fresh["n_reused"] == 0
    return fresh


def test_three_turns_reuse_the_kv_prefix_and_streamed_match_resident(model, tmp_path):
    csv = tmp_path / "s.csv"
    streamed = chat_turns(model, USERS, *STREAM, "--csv", str(csv))
    resident = chat_turns(model, USERS)
    assert [d["token_ids"] for d in streamed] == [d["token_ids"] for d in resident]
    assert all(len(d["token_ids"]) == 12 for d in streamed)
    assert len({t for d in streamed for t in d["token_ids"]}) > 12, "degenerate output"
    # the first turn has nothing to reuse: it is a fresh process's answer
    assert _fresh(model, streamed[0], *STREAM)["token_ids"] == streamed[0]["token_ids"]
    # the shared prefix is not recomputed: turns 2 and 3 prefill only what the KV cache does not hold
    assert streamed[0]["n_reused"] == 0
    for prev, d in zip(streamed, streamed[1:], strict=False):
        assert prev["n_prompt"] <= d["n_reused"] <= prev["n_past"]
        assert d["summary"]["n_prompt"] == d["n_prompt"] - d["n_reused"]
    m = read_metrics(csv)
    assert sorted(set(m.rows["turn"])) == [0, 1, 2]
    assert list(m.rows.groupby("turn").size()) == [12, 12, 12]
    assert len(m.summaries) == 3 and m.token_ids() == [t for d in streamed for t in d["token_ids"]]


def test_three_turns_without_kv_reuse_match_a_fresh_process_per_turn_streamed_and_resident(model):
    """--no-kv-reuse prefills each turn's whole history in one batch, as a fresh process does, so every turn is
    bit-identical to one (with reuse, llama.cpp's batch-size-dependent kernels can flip a near-tie)."""
    streamed = chat_turns(model, USERS, *STREAM, "--no-kv-reuse")
    resident = chat_turns(model, USERS, "--no-kv-reuse")
    assert [d["token_ids"] for d in streamed] == [d["token_ids"] for d in resident]
    for d in streamed:
        assert d["n_reused"] == 0
        assert _fresh(model, d, *STREAM)["token_ids"] == d["token_ids"], d["turn"]


def test_malformed_and_refused_requests_get_an_error_and_the_session_goes_on(model):
    s = SessionProc(model, "-c", "64")
    assert s.ready["n_ctx"] == 64 and s.ready["arch"] == "qwen3moe"
    bad = ["this is not json", "[1, 2]", json.dumps({"cmd": "dance", "id": 3}),
           json.dumps({"cmd": "generate", "id": 4, "messages": [{"role": "robot", "content": "x"}]}),
           json.dumps({"cmd": "generate", "id": 5, "messages": [{"role": "user", "content": "x"}], "n_predict": "9"}),
           json.dumps({"cmd": "generate", "id": 6}),
           json.dumps({"cmd": "generate", "id": 7, "prompt": "long " * 80})]
    for line in bad:
        s.send(line)
        e = s.event()
        assert e["event"] == "error" and e["fatal"] is False and e["msg"], (line, e)
        assert "\n" not in e["msg"]
    assert "exceeds the context of 64 tokens" in e["msg"]
    d = s.generate([{"role": "user", "content": "still there?"}], n_predict=4)
    assert d["tokens"] == 4 and d["finish"] == "length"
    s.send({"cmd": "generate", "id": 8, "prompt": "raw text, no template", "n_predict": 3})
    events, done = s.until("done")
    assert events[0] == {"event": "begin", "id": 8, "turn": 1, "n_prompt": done["n_prompt"], "n_reused": 1}
    assert done["tokens"] == 3  # only the BOS token was shared with the chat turn before
    assert s.close() == 0


def test_cancel_stops_the_generation_and_the_next_turn_runs(model):
    s = SessionProc(model, *STREAM, "-c", "2048")
    s.send({"cmd": "generate", "id": "a", "messages": [{"role": "user", "content": "go on"}], "n_predict": 1900})
    s.until("token")
    s.send({"cmd": "cancel"})
    _, done = s.until("done")
    assert done["cancelled"] is True and done["finish"] == "cancelled" and done["tokens"] < 1900
    d = s.generate([{"role": "user", "content": "go on"}], n_predict=5)
    assert d["tokens"] == 5 and d["n_reused"] > 0  # the cancelled turn's prompt is still in the KV cache
    assert s.close() == 0


def test_end_of_stdin_ends_the_session(model):
    s = SessionProc(model)
    assert s.p.stdin is not None
    s.p.stdin.close()
    assert s.p.wait(timeout=60) == 0


def test_a_deeply_nested_line_is_one_error_and_the_session_goes_on_to_its_end(model):
    s = SessionProc(model)
    for line in ("[" * 200_000, '{"cmd": "generate", "id": ' + "[" * 5000 + "]" * 5000 + "}", "{" * 100_000):
        s.send(line)
        e = s.event()
        assert e["event"] == "error" and e["fatal"] is False and "nested deeper than" in e["msg"], e
    d = s.generate([{"role": "user", "content": "still there?"}], n_predict=3)
    assert d["tokens"] == 3
    assert s.p.stdin is not None
    s.p.stdin.close()  # the end of stdin ends the session
    assert s.p.wait(timeout=60) == 0
    err = s.p.stderr.read()
    assert "Traceback" not in err and "RecursionError" not in err, err
