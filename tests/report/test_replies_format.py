"""bmoe-prompts v1 and bmoe-replies v1: round trip, and every malformed file refused in one line naming it."""

from __future__ import annotations

import json

import pytest

from harness.errors import UserError
from harness.formats.replies import PromptItem, RepliesWriter, Reply, read_prompts, read_replies, write_prompts


def _reply(turn: int, text: str = "x") -> Reply:
    return Reply(turn=turn, id=f"q{turn}", prompt="p", reply=text, n_prompt=1, n_tokens=1, stop="eog",
                 prefill_ms=1.0, decode_ms=1.0, time_ms=2.5)


def test_roundtrip_keeps_every_character(tmp_path):
    odd = "line\nsep\u2028para\u2029nul\x00 \u00e9 \U0001f600 ####"
    items = [PromptItem(id="a", prompt=odd), PromptItem(id="b", prompt="")]
    write_prompts(tmp_path / "p.jsonl", items)
    assert read_prompts(tmp_path / "p.jsonl") == items
    w = RepliesWriter(tmp_path / "r.jsonl")
    w.reply(_reply(0, odd))
    w.reply(_reply(1))
    w.close()
    assert [r.reply for r in read_replies(tmp_path / "r.jsonl")] == [odd, "x"]


@pytest.mark.parametrize("text, message", [
    ('{"id": "a", "prompt": "x"}\n', "no bmoe-prompts header line"),
    ('{"format": "bmoe-prompts", "version": 2}\n', "bmoe-prompts version 2 is not one this bmoe reads"),
    ('{"format": "bmoe-prompts", "version": 1}\n', "no prompts after the header"),
    ('{"format": "bmoe-prompts", "version": 1}\n{"id": "a"}\n', "p.jsonl:2: prompt: Field required"),
    ('{"format": "bmoe-prompts", "version": 1}\n{"id": "a", "prompt": "x", "n": 1}\n', "p.jsonl:2: n: Extra"),
    ('{"format": "bmoe-prompts", "version": 1}\nnot json\n', "p.jsonl:2: not valid JSON"),
    ('{"format": "bmoe-prompts", "version": 1}\n[1]\n', "p.jsonl:2: each line must be a JSON object"),
])
def test_bad_prompts_files(tmp_path, text, message):
    (tmp_path / "p.jsonl").write_text(text)
    with pytest.raises(UserError, match=message):
        read_prompts(tmp_path / "p.jsonl")


def test_replies_out_of_order_or_newer_are_refused(tmp_path):
    head = json.dumps({"format": "bmoe-replies", "version": 1}) + "\n"
    (tmp_path / "r.jsonl").write_text(head + json.dumps(_reply(1).dump()) + "\n")
    with pytest.raises(UserError, match="reply 1 has turn 1, expected 0"):
        read_replies(tmp_path / "r.jsonl")
    (tmp_path / "r.jsonl").write_text(head.replace("1}", "9}"))
    with pytest.raises(UserError, match="version 9"):
        read_replies(tmp_path / "r.jsonl")
    (tmp_path / "r.jsonl").write_text(head)
    assert read_replies(tmp_path / "r.jsonl") == []  # a run killed before its first answer
