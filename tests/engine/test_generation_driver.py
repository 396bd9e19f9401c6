"""The one generation driver (harness.engine.run.token_loop): one garbage-collector policy for every driver, the
sampling defaults taken from the flags, and no module reaching into the Session's private parts. The engine test
runs a one-shot run and conversation turns in this process on a generated model and checks that the cyclic
collector never runs while either generates (it did during a turn before the policy was shared)."""

from __future__ import annotations

import ast
import gc
import io
from pathlib import Path

import pytest

from harness.engine.config import parse_cli
from harness.engine.run.session import Sampling
from harness.engine.run.token_loop import collection_paused
from harness.synth import ModelSpec, make_model

ROOT = Path(__file__).resolve().parents[2]


def test_collection_is_off_while_generating_and_restored_after() -> None:
    assert gc.isenabled()
    with collection_paused():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        with pytest.raises(RuntimeError), collection_paused():
            raise RuntimeError("a failed decode")
        assert not gc.isenabled(), "a collector the caller had switched off stays off"
    finally:
        gc.enable()


def test_sampling_defaults_are_the_flags_and_a_request_overrides_them() -> None:
    cfg = parse_cli(["-m", "x.gguf", "--temp", "0.7", "--top-k", "5"])
    assert Sampling.of(cfg) == Sampling(n_predict=cfg.n_predict, temp=0.7, top_k=5, top_p=cfg.top_p, seed=cfg.seed)
    got = Sampling.of(cfg, temp=None, top_k=9, n_predict=3)
    assert (got.temp, got.top_k, got.n_predict, got.seed) == (0.7, 9, 3, cfg.seed)


def _private_reaches(tree: ast.AST) -> list[str]:
    """`x._name` where x is a session (a name `sess`/`session`, or `<anything>.session`/`.sess`)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            v = node.value
            name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else ""
            if name in ("sess", "session"):
                out.append(f"line {node.lineno}: {name}.{node.attr}")
    return out


def test_no_module_calls_the_sessions_private_methods() -> None:
    session_py = ROOT / "harness/engine/run/session.py"
    bad = [f"{p.relative_to(ROOT)} {hit}" for p in sorted((ROOT / "harness").rglob("*.py")) if p != session_py
           for hit in _private_reaches(ast.parse(p.read_text()))]
    bad += [f"{p.relative_to(ROOT)} {hit}" for p in sorted((ROOT / "scripts").glob("*.py"))
            for hit in _private_reaches(ast.parse(p.read_text()))]
    assert not bad
    assert _private_reaches(ast.parse("sess._decode([1])\nself.session._row(1)\n")) == [
        "line 1: sess._decode", "line 2: session._row"]


@pytest.mark.engine
def test_no_collection_runs_while_a_run_or_a_turn_generates(tmp_path: Path) -> None:
    from harness.engine.compose import open_engine
    from harness.engine.serve.turns import Conversation, sampling_of

    (path,) = make_model(tmp_path / "m.gguf", ModelSpec(seed=11))
    cfg = parse_cli(["-m", str(path), "-p", "The expert cache keeps hot experts near.", "-n", "24", "-t", "1",
                     "--moe-stream", "--cache-mb", "1"])
    eng = open_engine(cfg, io.StringIO())
    seen: list[tuple[str, int]] = []  # (what was generating, generation collected) per automatic collection
    now = ["idle"]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            seen.append((now[0], info["generation"]))

    def garbage() -> None:  # a consumer that allocates, as the server's does
        [[i] for i in range(2000)]

    rows = [0]

    def between_tokens() -> None:  # from the first row to the last: the generator is suspended mid-generation
        rows[0] += 1
        now[0] = "run"
        garbage()
        if rows[0] == 24:
            now[0] = "idle"

    gc.callbacks.append(on_gc)
    try:
        res = eng.run(between_tokens=between_tokens)
        assert res.summary.n_decode == 24 and now[0] == "idle"
        conv = Conversation(eng)
        for text in ("Name the expert cache.", "And across turns?"):
            tokens = conv.prompt_tokens(messages=[{"role": "user", "content": text}])
            for d in conv.generate(tokens, sampling_of(cfg, n_predict=12)):
                now[0] = "turn"
                garbage()
                if d.row.step == 12:
                    now[0] = "idle"
            assert conv.last is not None and len(conv.last.tokens) == 12 and conv.last.n_past == len(conv.past)
        gc.collect()
    finally:
        gc.callbacks.remove(on_gc)
        eng.close()
    assert [s for s in seen if s[0] != "idle"] == []
    assert ("idle", 2) in seen  # the callback does see collections (the explicit one above at least)
