"""Shared by the session, chat and server tests: drive `bmoe --session` as a real subprocess over its pipes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BMOE = [sys.executable, "-m", "harness.engine.cli"]


class SessionProc:
    """One `bmoe --session` process: send request lines, read event lines."""

    def __init__(self, model: Path | str, *flags: str):
        self.p = subprocess.Popen([*BMOE, "--session", "-m", str(model), "-t", "2", *flags], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.ready = self.event()
        assert self.ready["event"] == "ready", self.ready

    def send(self, req: dict[str, Any] | str) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write((req if isinstance(req, str) else json.dumps(req)) + "\n")
        self.p.stdin.flush()

    def event(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise AssertionError(f"the session ended: rc={self.p.wait()} stderr={self.p.stderr.read()}")
        return json.loads(line)

    def until(self, *names: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Events up to (not including) the first one named in `names`, and that one."""
        seen = []
        while True:
            e = self.event()
            if e["event"] in names:
                return seen, e
            seen.append(e)

    def generate(self, messages: list[dict[str, str]], **kw: Any) -> dict[str, Any]:
        self.send({"cmd": "generate", "messages": messages, **kw})
        events, done = self.until("done", "error")
        assert done["event"] == "done", done
        tokens = [e for e in events if e["event"] == "token"]
        assert [e["token_id"] for e in tokens] == done["token_ids"]
        joined = "".join(e["text"] for e in tokens)  # plus U+FFFD for a UTF-8 sequence cut off at the end
        assert done["text"] in (joined, joined + "\ufffd")
        return done

    def close(self) -> int:
        self.send({"cmd": "close"})
        rc = self.p.wait(timeout=60)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            if f:
                f.close()
        return rc


def chat_turns(model: Path | str, users: list[str], *flags: str, n: int = 12) -> list[dict[str, Any]]:
    """A multi-turn session: each user line after the replies so far; the `done` of each turn."""
    s = SessionProc(model, *flags)
    msgs: list[dict[str, str]] = []
    out = []
    try:
        for u in users:
            msgs.append({"role": "user", "content": u})
            d = s.generate(msgs, n_predict=n)
            d["messages"] = list(msgs)
            msgs.append({"role": "assistant", "content": d["text"]})
            out.append(d)
    finally:
        assert s.close() == 0
    return out


def assert_session_drafts_like_plain(model: Path | str, *flags: str) -> None:
    """A session drafting ahead with `flags` (--ngram / --mtp) gives plain greedy's tokens over two chat turns,
    keeps some drafts, and refuses a sampled request in one line without ending (drafts are greedy only)."""
    users = ["1 2 3 1 2 3 1 2 3 1 2 3", "3 2 1 3 2 1 3 2 1"]
    drafted = chat_turns(model, users, *flags, "--moe-stream", "--cache-mb", "1", n=24)
    plain = chat_turns(model, users, n=24)
    assert [d["token_ids"] for d in drafted] == [d["token_ids"] for d in plain]
    assert sum(d["summary"]["draft_accepted"] for d in drafted) > 0
    s = SessionProc(model, *flags)
    s.send({"cmd": "generate", "messages": [{"role": "user", "content": "hi"}], "n_predict": 4, "temp": 0.9})
    _, err = s.until("error", "done")
    assert err["event"] == "error" and not err["fatal"] and "greedy only" in err["msg"]
    assert s.generate([{"role": "user", "content": "hi"}], n_predict=4)["finish"] in ("length", "stop")
    assert s.close() == 0
