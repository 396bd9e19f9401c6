"""`--prompts-file`: one engine process answers every prompt, one CSV turn each, the KV cache cleared between
prompts and the expert cache kept. Byte-identity gates: streamed (cache warm across prompts, with
evictions) == resident, turn by turn; and each turn == a fresh single-prompt run of that prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.errors import UserError
from harness.formats.metrics_csv import read_metrics
from harness.formats.replies import PromptItem, read_replies, write_prompts
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe

N = 16
PROMPTS = ["Janet has 16 ducks and eats 3 eggs a day.", "The expert cache keeps hot experts near.",
           "A robe takes 2 bolts of blue fiber and half that much white fiber."]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("prompts")
    return make_model(d / "m.gguf", ModelSpec(expert_type="q8_0", seed=7, chat_template="qwen3"))[0]


def _prompts(tmp: Path, texts: list[str]) -> Path:
    p = tmp / "prompts.jsonl"
    write_prompts(p, [PromptItem(id=f"q{i}", prompt=t) for i, t in enumerate(texts)])
    return p


def _turns(csv: Path) -> list[list[int]]:
    m = read_metrics(csv)
    assert len(m.summaries) == len(set(m.rows["turn"])), "one # summary line per turn"
    return [[int(x) for x in g["token_id"]] for _, g in m.rows.groupby("turn", sort=True)]


def _csv(tmp: Path) -> Path:
    return sorted(tmp.glob("run-*.csv"), key=lambda p: int(p.stem.split("-")[1]))[-1]


@pytest.mark.engine
def test_prompts_file_streamed_equals_resident_and_each_turn_a_fresh_run(model, tmp_path):
    pf = _prompts(tmp_path, PROMPTS)
    res = bmoe(model, "--prompts-file", str(pf), "--replies", str(tmp_path / "res.jsonl"), n=N, tmp=tmp_path)
    assert res.rc == 0, res.stderr
    resident = _turns(_csv(tmp_path))
    # 1 MiB of cache holds a fraction of the experts: evictions across prompts, the cache never reset
    st = bmoe(model, "--prompts-file", str(pf), "--replies", str(tmp_path / "st.jsonl"), "--moe-stream",
              "--cache-mb", "1", "--force-cache", n=N, tmp=tmp_path)
    assert st.rc == 0, st.stderr
    streamed = _turns(_csv(tmp_path))
    assert len(resident) == len(PROMPTS) and all(len(t) == N for t in resident)
    assert streamed == resident
    assert float(st.summary["evictions"]) > 0
    for i, text in enumerate(PROMPTS):
        one = bmoe(model, n=N, tmp=tmp_path, prompt=text)
        assert one.rc == 0, one.stderr
        assert one.tokens == resident[i], f"turn {i} differs from a fresh run of its prompt"
    assert len({tuple(t) for t in resident}) == len(PROMPTS), "distinct prompts, distinct replies"
    # the replies: one per prompt, in order, the same text in both modes
    a, b = read_replies(tmp_path / "res.jsonl"), read_replies(tmp_path / "st.jsonl")
    assert [r.id for r in a] == ["q0", "q1", "q2"] and [r.turn for r in a] == [0, 1, 2]
    assert [r.reply for r in a] == [r.reply for r in b]
    assert [r.prompt for r in a] == PROMPTS  # no --chatml: sent as given
    assert all(r.n_tokens == N and r.stop == "limit" and r.time_ms >= r.decode_ms > 0 for r in a)


@pytest.mark.engine
def test_prompt_as_sent_is_recorded_after_the_chat_template(model, tmp_path):
    pf = _prompts(tmp_path, PROMPTS[:2])
    r = bmoe(model, "--prompts-file", str(pf), "--replies", str(tmp_path / "r.jsonl"), "--chatml", "--no-think",
             n=4, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    sent = [x.prompt for x in read_replies(tmp_path / "r.jsonl")]
    assert all(s.startswith("<|im_start|>user\n") and "<think>\n\n</think>" in s for s in sent)
    assert PROMPTS[0] in sent[0] and PROMPTS[1] in sent[1]


@pytest.mark.engine
def test_a_prompt_too_long_is_refused_before_the_first_answer(model, tmp_path):
    pf = _prompts(tmp_path, ["short", "x " * 400])
    r = bmoe(model, "--prompts-file", str(pf), "--replies", str(tmp_path / "r.jsonl"), "-c", "128", n=8,
             tmp=tmp_path)
    assert r.rc == 2
    assert "prompt 'q1'" in r.stderr and "exceeds the context" in r.stderr and "Traceback" not in r.stderr
    assert read_replies(tmp_path / "r.jsonl") == []


def test_a_bad_prompts_file_is_one_line(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "prompt": "x"}\n')
    out = subprocess.run([sys.executable, "-m", "harness.engine.cli", "-m", str(tmp_path / "none.gguf"),
                          "--prompts-file", str(p)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().endswith("not a bmoe-prompts file") and len(out.stderr.strip().splitlines()) == 1
    p.write_text(json.dumps({"format": "bmoe-prompts", "version": 1}) + "\n" + '{"id": "a", "prompt": "x"}\n' * 2)
    out = subprocess.run([sys.executable, "-m", "harness.engine.cli", "-m", str(tmp_path / "none.gguf"),
                          "--prompts-file", str(p)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "prompt id 'a' appears twice" in out.stderr


@pytest.mark.parametrize("argv, message", [
    (["--replies", "r.jsonl"], "--replies records the answers of a --prompts-file run"),
    (["--prompts-file", "p.jsonl", "--temp", "0.7"], "--prompts-file runs are greedy"),
    (["--prompts-file", "p.jsonl", "--route-replay", "t.csv"], "cannot be combined with --prompts-file"),
])
def test_prompts_file_flag_rules(argv, message):
    with pytest.raises(UserError, match=message):
        parse_cli(["-m", "m.gguf", *argv])
