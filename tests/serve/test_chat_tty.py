"""`bmoe chat` through a real pseudo-terminal (pexpect): the live panel shows tok/s, flash I/O against compute,
hit %, MiB read per token, RSS and MemAvailable; Ctrl-C stops the reply and the chat goes on; /quit leaves."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model

pexpect = pytest.importorskip("pexpect", reason="pexpect is in the dev extra (pip install -e '.[dev]')")
pytestmark = pytest.mark.engine

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PANEL = ("tok/s", "flash I/O", "compute", "hit", "MiB read", "RSS", "MemAvailable", "per token")


class Tty:
    def __init__(self, *argv: str):
        self.c = pexpect.spawn(sys.executable, ["-m", "harness.engine.cli", *argv], encoding="utf-8", timeout=120,
                               dimensions=(50, 100))
        self.seen = ""

    def wait(self, pred, what: str, timeout: float = 120) -> str:
        """Read until pred(text so far, ANSI codes stripped) holds."""
        end = time.monotonic() + timeout
        while not pred(self.seen):
            if time.monotonic() > end:
                raise AssertionError(f"no {what} on the terminal; it showed:\n{self.seen[-3000:]}")
            try:
                self.seen += ANSI.sub("", self.c.read_nonblocking(65536, timeout=0.2))
            except pexpect.TIMEOUT:
                pass
        return self.seen

    def mark(self) -> None:
        self.seen = ""


def _tokens_shown(text: str) -> int:
    """The largest token count the panel has shown (its second row: tok/s, tokens, ...)."""
    counts = [int(m.group(1)) for m in re.finditer(r"│ [-\d.]+\s+(\d+)\s+", text)]
    return max(counts, default=0)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("chat") / "m.gguf", ModelSpec(seed=12))[0]


def test_chat_live_panel_ctrl_c_stops_the_reply_not_the_chat(model):
    t = Tty("chat", "-m", str(model), "-t", "2", "--moe-stream", "--cache-mb", "1", "-n", "2000", "-c", "2048")
    t.wait(lambda s: "you>" in s, "prompt")
    t.mark()
    t.c.sendline("Tell me about experts.")
    t.wait(lambda s: _tokens_shown(s) >= 2, "token count in the live panel")
    t.c.sendintr()
    shown = t.wait(lambda s: "stopped (Ctrl-C)" in s and "you>" in s, "stopped reply and a new prompt")
    for label in PANEL:
        assert label in shown, label
    assert 2 <= _tokens_shown(shown) < 2000
    assert re.search(r"\d+\.\d\d\s+\d+\s+[\d.]+ ms\s+[\d.]+ ms\s+[\d.]+ %\s+[\d.]+\s+\d+ MiB\s+\d+ MiB", shown), shown
    t.mark()
    t.c.sendline("/n 40")
    t.wait(lambda s: "replies up to 40 tokens" in s, "the new reply length")
    t.mark()
    t.c.sendline("And now?")  # the chat goes on: a full reply this time
    shown = t.wait(lambda s: "40 tokens (-n)" in s and "you>" in s, "a complete second reply")
    assert _tokens_shown(shown) == 40
    t.c.sendline("/quit")
    t.c.expect(pexpect.EOF)
    t.c.close()
    assert t.c.exitstatus == 0


def test_chat_ctrl_c_at_the_prompt_and_ctrl_d(model):
    t = Tty("chat", "-m", str(model), "-t", "2")
    t.wait(lambda s: "you>" in s, "prompt")
    t.mark()
    t.c.sendintr()
    t.wait(lambda s: "Ctrl-D or /quit leaves" in s and "you>" in s, "a hint and the prompt again")
    t.c.sendeof()
    t.c.expect(pexpect.EOF)
    t.c.close()
    assert t.c.exitstatus == 0
