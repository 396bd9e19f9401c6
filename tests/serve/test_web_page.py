"""The chat page at / of `bmoe serve`, in a real headless Chromium (Debian's `chromium` package, driven over the
DevTools protocol): it renders, sends a prompt typed into it, streams the reply and shows tok/s and the rest of
the telemetry panel. The screenshot is kept in the test's tmp directory (pytest keeps the last ones), or where
BMOE_WEB_SCREENSHOT says (reports/web/chat-page.png was made so)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.synth import ModelSpec, make_model
from tests.helpers.cdp import Browser, chromium
from tests.helpers.serve import Server

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("web") / "m.gguf", ModelSpec(seed=14))[0]


def test_chat_page_renders_streams_a_reply_and_shows_tok_s(model, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium on this machine (apt-get install chromium; .ci/run installs it)")
    s = Server(model, tmp_path, "--moe-stream", "--cache-mb", "1", "-n", "120")
    b = Browser(exe)
    try:
        b.open(s.url + "/")
        b.wait("document.readyState === 'complete' && document.getElementById('model').textContent.startsWith('m ')")
        assert b.js("document.title") == "bmoe chat"
        b.js("document.getElementById('prompt').value = 'Tell me about the expert cache.'")
        b.js("document.getElementById('send').click()")
        b.wait("document.getElementById('status').textContent === 'generating'", timeout=30)
        # streamed: part of the reply and the panel are shown while it is still generating
        b.wait("document.getElementById('status').textContent === 'generating' && "
               "document.querySelectorAll('.msg.assistant .body')[0].textContent.length > 0 && "
               "Number(document.getElementById('t-n').textContent) >= 1")
        b.wait("document.getElementById('status').textContent.startsWith('done')")
        panel = json.loads(b.js("JSON.stringify(Object.fromEntries([...document.querySelectorAll('dt')].map("
                                "(dt) => [dt.textContent, dt.nextElementSibling.textContent])))"))
        assert float(panel["tok/s"]) > 0, panel
        assert panel["tokens"] == "120" and panel["cache hit"].endswith("%"), panel
        assert panel["flash I/O / token"].endswith("ms") and float(panel["MiB read / token"]) > 0, panel
        assert panel["RSS"].endswith("MiB") and panel["MemAvailable"].endswith("MiB"), panel
        assert b.js("document.getElementById('status').textContent") == "done: 120 tokens (length)"
        reply = b.js("document.querySelectorAll('.msg.assistant .body')[0].textContent")
        assert b.js("document.querySelectorAll('.msg.user .body')[0].textContent") == "Tell me about the expert cache."
        png = b.screenshot()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
        shot = Path(os.environ.get("BMOE_WEB_SCREENSHOT") or tmp_path / "chat-page.png")
        shot.parent.mkdir(parents=True, exist_ok=True)
        shot.write_bytes(png)
    finally:
        b.close()
        assert s.stop() == 0
    assert reply


def test_chat_page_with_an_api_key_asks_for_it_and_then_chats(model, tmp_path):
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium on this machine (apt-get install chromium; .ci/run installs it)")
    s = Server(model, tmp_path, "--moe-stream", "--cache-mb", "1", "-n", "8", env={"BMOE_API_KEY": "page-key-9"})
    b = Browser(exe)
    try:
        b.open(s.url + "/")
        b.wait("document.getElementById('model')?.textContent.includes('needs an API key')")
        b.js("const k = document.getElementById('key'); k.value = 'page-key-9'; "
             "k.dispatchEvent(new Event('change'))")
        b.wait("document.getElementById('model').textContent.startsWith('m ')")
        for text in ("Hello there.", "And again."):  # two turns: the second reuses the first's KV prefix
            b.js(f"document.getElementById('prompt').value = {text!r}")
            b.js("document.getElementById('send').click()")
            b.wait("document.getElementById('status').textContent.startsWith('done')", timeout=60)
            b.wait("!document.getElementById('send').disabled")
        assert b.js("document.getElementById('status').textContent") == "done: 8 tokens (length)"
        reused, prompt = b.js("document.getElementById('t-reused').textContent").split(" / ")
        assert 0 < int(reused) < int(prompt)
    finally:
        b.close()
        assert s.stop() == 0
