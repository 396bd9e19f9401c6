"""Trace reading (the route_trace v1 format and the replay's batches), replay against the engine's record
on the recorded real traces (data/route-traces), and the CLI."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from harness.bench_cli import main
from harness.engine.cache.policies import online_policies
from harness.errors import UserError
from harness.formats.route_trace import (
    DECODE,
    PREFILL,
    Route,
    RouteTraceWriter,
    TraceFormatError,
    parse_route_trace,
    read_route_trace,
)
from harness.replay.report import fine_grid
from harness.replay.simulate import MIB, replay
from harness.replay.trace import load_trace, parse_trace
from harness.replay.validate import lru_agreement, read_engine_log

TRACES = Path(__file__).resolve().parents[2] / "data" / "route-traces"

SMALL = """# route_trace v1
# model=x.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2
# layer=0 expert_bytes=100 dense_bytes=5
# layer=1 expert_bytes=200 dense_bytes=5
turn,phase,step,layer,slot,expert,weight,residency,expert_bytes
0,0,0,0,0,3,0.6,0,100
0,0,0,0,1,1,0.4,0,100
0,0,1,0,0,1,0.5,0,0
0,0,1,0,1,5,0.5,0,100
0,0,1,1,0,2,0.5,0,200
0,0,1,1,1,7,0.5,0,200
0,1,2,0,0,1,0.5,1,0
0,1,2,0,1,4,0.5,0,100
0,1,2,1,0,7,0.5,1,0
0,1,2,1,1,6,0.5,0,200
0,1,3,0,0,4,0.5,1,0
0,1,3,0,1,3,0.5,1,0
0,1,3,1,0,6,0.5,1,0
0,1,3,1,1,2,0.5,1,0
"""


def test_the_format_reads_the_header_and_every_row() -> None:
    f = parse_route_trace(SMALL.splitlines(), "small")
    h = f.header
    assert (h.model, h.arch, h.n_layer, h.n_expert, h.k) == ("x.gguf", "qwen3moe", 2, 8, 2)
    assert (h.expert_bytes, h.dense_bytes) == ([100, 200], [5, 5])
    assert len(f.rows) == 14 and f.rows[0] == Route(turn=0, phase=PREFILL, step=0, layer=0, slot=0, expert=3,
                                                    residency=0, line=6)
    assert f.rows[-1] == Route(0, DECODE, 3, 1, 1, 2, 1, 19)


def test_writer_output_is_the_format_and_reads_back(tmp_path: Path) -> None:
    """The bytes bmoe writes (pinned), and the reader gives back what went in."""
    p = tmp_path / "w.route.csv"
    w = RouteTraceWriter(str(p), "m.gguf", "qwen3moe", 2, 8, 2, [100, 200], {0: 5})
    ev = [SimpleNamespace(layer=0, phase=PREFILL, ids=np.array([[3, 1], [1, 5]]), residency={1: 1}),
          SimpleNamespace(layer=1, phase=PREFILL, ids=np.array([[2, 7], [7, 6]]), residency={})]
    w.events(0, 0, ev)
    w.events(0, 2, [SimpleNamespace(layer=1, phase=DECODE, ids=np.array([[6, 2]]), residency={6: 2, 2: 1})])
    w.close()
    assert p.read_text() == (
        "# route_trace v2\n# model=m.gguf arch=qwen3moe n_layer=2 n_expert=8 n_expert_used=2\n"
        "# layer=0 expert_bytes=100 dense_bytes=5\n# layer=1 expert_bytes=200 dense_bytes=0\n"
        "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"
        "0,0,0,0,0,3,-1,0,100,0\n0,0,0,0,1,1,-1,1,100,0\n0,0,1,0,0,1,-1,1,100,0\n0,0,1,0,1,5,-1,0,100,0\n"
        "0,0,0,1,0,2,-1,0,200,0\n0,0,0,1,1,7,-1,0,200,0\n0,0,1,1,0,7,-1,0,200,0\n0,0,1,1,1,6,-1,0,200,0\n"
        "0,1,2,1,0,6,-1,2,200,0\n0,1,2,1,1,2,-1,1,200,0\n")
    f = read_route_trace(p)
    assert f.name == "w" and f.header.dense_bytes == [5, 0]
    assert [(r.phase, r.step, r.layer, r.expert, r.residency) for r in f.rows][-2:] == [(1, 2, 1, 6, 2),
                                                                                         (1, 2, 1, 2, 1)]


def test_parse_groups_prefill_by_layer_and_decode_by_token() -> None:
    t = parse_trace(SMALL.splitlines(), "small")
    assert (t.n_layer, t.n_expert, t.k, t.expert_bytes) == (2, 8, 2, [100, 200])
    assert (t.prefill_tokens, t.decode_tokens) == (2, 2)
    assert [(b.layer, b.experts, b.token) for b in t.batches] == [
        (0, (3, 1, 1, 5), -1),  # prefill: every prompt token's experts, duplicates kept
        (1, (2, 7), -1),
        (0, (1, 4), 0),
        (1, (7, 6), 0),
        (0, (4, 3), 1),
        (1, (6, 2), 1),
    ]
    assert t.batches[0].unique == (3, 1, 5)
    assert t.cycle_bytes == 2 * (100 + 200)
    assert t.lookups == 3 + 2 + 2 + 2 + 2 + 2
    r = replay(t, "lru", 10_000)  # nothing evicted: hits are the re-uses
    assert (r.hits, r.lookups) == (6, 13)
    assert r.mib_per_token == pytest.approx((100 + 200) / MIB / 2)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: s.replace("route_trace v1", "route_trace v9"), "not supported"),
        (lambda s: s.replace("# layer=1 expert_bytes=200 dense_bytes=5\n", ""), "for each of 2 layers"),
        (lambda s: s.replace("0,1,3,1,1,2,0.5,1,0", "0,1,3,1,1,9,0.5,1,0"), "outside the header"),
        (lambda s: s.replace("0,1,3,1,1,2,0.5,1,0", "0,1,3,x"), "numeric fields"),
        (lambda s: s.replace("turn,phase", "phase,turn"), "column header"),
    ],
)
def test_parse_refuses_malformed(mutate, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        parse_route_trace(mutate(SMALL).splitlines())
    with pytest.raises(TraceFormatError, match=message):  # and the replay reads through the format
        parse_trace(mutate(SMALL).splitlines())


def test_load_trace_turns_problems_into_one_line_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        load_trace(tmp_path / "missing.route.csv")
    bad = tmp_path / "bad.route.csv"
    bad.write_text("hello\n")
    with pytest.raises(UserError) as e:
        load_trace(bad)
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


@pytest.mark.parametrize("name", ["qwen", "gptoss"])
def test_lru_replay_reproduces_the_engine_record(name: str) -> None:
    path = TRACES / f"{name}.route.csv"
    log = read_engine_log(path)
    assert log is not None and log.budget_mib in (3000, 4000)
    agr = lru_agreement(load_trace(path), log.budget_mib)
    assert abs(agr.replay_hit_pct - log.hit_pct) <= 0.1  # the engine's printed moe-cache line
    assert agr.same == agr.lookups  # and lookup by lookup against the trace's residency column


@pytest.mark.parametrize("budget_mib", [500, 2000, 4000])
@pytest.mark.parametrize("name", ["qwen", "gptoss"])
def test_belady_bounds_every_online_policy_on_real_traces(name: str, budget_mib: int) -> None:
    """gptoss's experts all have one size, where Belady is the optimum: no policy has more hits or reads
    fewer bytes. qwen's differ by layer (2.65 and 3.06 MB), where it is not (tests/engine/test_policies.py
    shows a counterexample); the bound there is Belady with every expert at the smallest size, since a
    byte budget never holds more entries than that (same file)."""
    t = load_trace(TRACES / f"{name}.route.csv")
    smallest = min(t.expert_bytes)
    equal = t.expert_bytes == [smallest] * t.n_layer
    assert equal == (name == "gptoss")
    best = replay(replace(t, expert_bytes=[smallest] * t.n_layer), "belady", budget_mib * MIB)
    for pol in online_policies():
        r = replay(t, pol, budget_mib * MIB)
        assert r.hits <= best.hits and r.bytes_read >= best.bytes_read, pol


def test_fine_grid_spans_under_t_to_past_the_working_set() -> None:
    t = load_trace(TRACES / "gptoss.route.csv")
    g = fine_grid(t, 12)
    assert g[0] * MIB < t.cycle_bytes and g[-1] * MIB > t.working_set_bytes
    assert {2000, 3000, 4000} <= set(g)


def test_cli_csv_columns(capsys) -> None:
    rc = main(["replay", str(TRACES / "gptoss.route.csv"), "--budgets", "500,3000",
               "--policies", "lru,belady", "--format", "csv"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "trace,policy,budget_mib,hit_pct,mib_per_token"
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["trace"], r["policy"], r["budget_mib"]) for r in rows] == [
        ("gptoss", "lru", "500"), ("gptoss", "belady", "500"), ("gptoss", "lru", "3000"), ("gptoss", "belady", "3000")
    ]
    assert float(rows[0]["hit_pct"]) == 0.0  # LRU under T: sequential flooding
    assert abs(float(rows[2]["hit_pct"]) - 32.4) <= 0.1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "lru,mru"], "unknown policy mru"),
        (["--budgets", "five"], "--budgets"),
        (["--format", "json"], "--format"),
    ],
)
def test_cli_user_errors_are_one_line(tmp_path: Path, capsys, args: list[str], message: str) -> None:
    trace = tmp_path / "small.route.csv"
    trace.write_text(SMALL)
    rc = main(["replay", str(trace), *args])
    err = capsys.readouterr().err
    assert rc != 0 and message in err and err.count("\n") == 1


def test_cli_bad_trace_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "x.route.csv"
    bad.write_text("not a trace\n")
    assert main(["replay", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "route_trace v1" in err and err.count("\n") == 1


def test_report_command_writes_findings_csv_and_plots(tmp_path: Path) -> None:
    trace = tmp_path / "small.route.csv"
    trace.write_text(SMALL)
    out = tmp_path / "rep"
    rc = main(["replay-report", str(trace), "--out", str(out), "--policies", "lru,aged,belady",
               "--steps", "3", "--goal-trace", "small"])
    assert rc == 0
    md = (out / "findings.md").read_text()
    assert md.splitlines()[2] == "## Verdict" and "bmoe-bench replay-report" in md
    assert (out / "replay.csv").read_text().startswith("trace,policy,budget_mib,hit_pct,mib_per_token\n")
    assert (out / "curves-small.png").stat().st_size > 1000
    # the author-notes section survives a regeneration
    mark = "<!-- author-notes: begin (kept verbatim when the report is regenerated) -->\n"
    (out / "findings.md").write_text(md.replace(mark, mark + "my notes\n", 1))
    assert main(["replay-report", str(trace), "--out", str(out), "--policies", "lru,aged,belady", "--steps", "3",
                 "--goal-trace", "small"]) == 0
    assert mark + "my notes\n" in (out / "findings.md").read_text()


REPORT = Path(__file__).resolve().parents[2] / "bench-data" / "2026-11-30-cache-replay" / "replay.csv"


def _replay_rows(path: Path) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(trace, policy, budget_mib) -> (hit_pct, mib_per_token) of a committed replay CSV, by column name."""
    with open(path, newline="") as f:
        return {(r["trace"], r["policy"], r["budget_mib"]): (float(r["hit_pct"]), float(r["mib_per_token"]))
                for r in csv.DictReader(f)}


def test_committed_report_matches_the_code() -> None:
    """Spot-check the committed raw CSV against a fresh replay: a policy change must regenerate it
    (the command is in its findings.md)."""
    rows = _replay_rows(REPORT)
    gptoss = load_trace(TRACES / "gptoss.route.csv")
    qwen = load_trace(TRACES / "qwen.route.csv")
    checks = [(gptoss, p, 3000) for p in ("lru", "lfu", "layer", "layer-lfu", "aged", "aged-decay",
                                           "aged-markov", "markov-duel", "belady")]
    checks += [(qwen, p, 2000) for p in ("lru", "aged-markov", "markov-duel", "belady")]
    for t, pol, b in checks:
        r = replay(t, pol, b * MIB)
        assert rows[(t.name, pol, str(b))] == (round(r.hit_pct, 3), round(r.mib_per_token, 3)), (t.name, pol, b)


def test_committed_bounds_match_the_code() -> None:
    """Spot-check the committed informed bounds (bounds.csv) against a fresh replay."""
    from harness.replay.bounds import make_bound

    rows = _replay_rows(REPORT.with_name("bounds.csv"))
    gptoss = load_trace(TRACES / "gptoss.route.csv")
    qwen = load_trace(TRACES / "qwen.route.csv")
    for t, pol, b in [(gptoss, "told-popularity", 3000), (gptoss, "told-next-16", 2000), (qwen, "told-both", 2000)]:
        r = replay(t, make_bound(pol, t), b * MIB)
        assert rows[(t.name, pol, str(b))] == (round(r.hit_pct, 3), round(r.mib_per_token, 3)), (t.name, pol, b)
