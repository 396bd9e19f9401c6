"""--io-trace and --compute-trace: the io_trace v1 / compute_trace v1 formats (round trip, refusals), the
recorders against a real SliceReader, the flag and campaign rules; then on a generated model: the traces agree
with the metrics CSV and the route trace, the output is byte-identical with tracing on, the timeline is drawn,
and a traced campaign commits, reports and checks its traces."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from harness.campaigns.runner import plan_record
from harness.campaigns.validate import engine_argv_tail, plan_campaign
from harness.engine.config import parse_cli
from harness.engine.io.reader import SliceReader
from harness.engine.io.tracing import Tracing
from harness.errors import UserError
from harness.formats.manifest import plan_hash
from harness.formats.metrics_csv import read_metrics
from harness.formats.route_trace import read_route_trace
from harness.formats.traces import (
    COMPUTE_FORMAT,
    IO_FORMAT,
    Interval,
    ReadRow,
    TraceFormatError,
    TraceWriter,
    layer_totals,
    parse_trace,
    read_compute_trace,
    read_io_trace,
)
from harness.report.timeline import median_step, timeline_png, token_view
from harness.synth import ModelSpec, make_model
from tests.bench.test_campaign_schema import errors, write
from tests.helpers.engine import bmoe
from tests.helpers.runner import quiet

PNG = b"\x89PNG\r\n\x1a\n"
BENCH = [sys.executable, "-m", "harness.bench_cli"]

# -- formats --------------------------------------------------------------------------------------------------

READS = [ReadRow(0, 0, 0, 0, 1, 7, "ffn_gate_exps", "demand", 0, 4096, 100, 8192, 10, 20, 30, "used"),
         ReadRow(1, 0, 1, 3, 2, 9, "ffn_down_exps", "speculative", 1, 8192, 100, 100, 15, 15, 40, "wasted")]
SPANS = [Interval(0, 1, 3, -1, "compute", 100, 200), Interval(0, 1, 3, 0, "hook", 200, 210),
         Interval(0, 1, 3, 0, "wait", 210, 260), Interval(0, 1, 3, 0, "compute", 260, 400)]


def _write(path: Path, fmt: str, rows, **pre) -> Path:
    w = TraceWriter(path, fmt, {"io_threads": 2, **pre})
    w.rows(rows)
    w.close()
    return path


def test_both_formats_round_trip_with_their_preamble(tmp_path: Path) -> None:
    io = read_io_trace(_write(tmp_path / "a.io.csv", IO_FORMAT, READS, perturbs="yes"))
    assert io.rows == READS and io.meta["perturbs"] == "yes" and io.meta["clock"].startswith("perf_counter_ns")
    ct = read_compute_trace(_write(tmp_path / "a.compute.csv", COMPUTE_FORMAT, SPANS))
    assert ct.rows == SPANS
    assert layer_totals(ct.rows)[(0, 1, 3, 0)] == {"compute": 140, "wait": 50, "hook": 10}


@pytest.mark.parametrize("mutate, message", [
    (lambda t: t.replace("io_trace v1", "io_trace v9"), "version 'v9' is not supported"),
    (lambda t: t.replace("read,turn", "id,turn"), "column header is"),
    (lambda t: t.replace(",10,20,30,", ",10,40,30,"), "line 5: times are not issued <= started <= finished"),
    (lambda t: t.replace(",speculative,1,", ",speculative,2,"), "lane 2 outside 0..io_threads-1 (2)"),
    (lambda t: t.replace(",demand,", ",maybe,"), "kind 'maybe' is not one of demand, speculative"),
    (lambda t: t.replace(",used", ",used,9"), "expected 16 fields"),
])
def test_parse_refuses_malformed(tmp_path: Path, mutate, message: str) -> None:
    text = _write(tmp_path / "a.csv", IO_FORMAT, READS).read_text()
    with pytest.raises(TraceFormatError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_trace(mutate(text).splitlines())


def test_reading_the_wrong_kind_of_file_is_one_line(tmp_path: Path) -> None:
    p = _write(tmp_path / "a.csv", COMPUTE_FORMAT, SPANS)
    with pytest.raises(UserError, match=r"^io_trace .*a\.csv: it is a compute_trace file; give an? io_trace"):
        read_io_trace(p)


# -- recorders --------------------------------------------------------------------------------------------------

def test_io_trace_records_what_the_reader_did_on_its_lane(tmp_path: Path) -> None:
    f = tmp_path / "blob"
    f.write_bytes(os.urandom(1 << 20))
    tr = Tracing(io=True, compute=False)
    tr.decode_begin()  # the prompt's batch: phase 0 step 0
    tr.decode_end()
    tr.decode_begin()  # token 1
    r = SliceReader([f], lanes=2, odirect=False)
    r.recorder = tr.io
    buf = ctypes.create_string_buffer(8 << 10)
    assert tr.io is not None
    try:
        ids = [tr.io.record(layer=1, expert=e, tensor="ffn_up_exps", offset=e * 4096, length=4096) for e in range(2)]
        futs = [r.submit(f, e * 4096, 4096, ctypes.addressof(buf) + e * 4096, rid) for e, rid in enumerate(ids)]
        spec = tr.io.record(layer=2, expert=5, tensor="ffn_up_exps", offset=0, length=100, kind="speculative")
        futs.append(r.submit(f, 0, 100, ctypes.addressof(buf), spec))
        assert [x.result()[0] for x in futs] == [4096, 4096, 100]
        untagged = r.submit(f, 0, 10, ctypes.addressof(buf))  # no tag: not recorded
        untagged.result()
    finally:
        r.close()
    rows = [ReadRow(*x) for x in tr.io.take(turn=0)]
    assert [x.read for x in rows] == ids  # the speculative read waits for its outcome
    for x in rows:
        assert (x.phase, x.step, x.kind, x.outcome, x.bytes) == (1, 1, "demand", "used", 4096)
        assert x.finished_ns >= x.started_ns >= x.issued_ns and x.lane in (0, 1)
    tr.io.outcome(spec, "wasted")
    (last,) = [ReadRow(*x) for x in tr.io.take()]
    assert (last.read, last.kind, last.outcome, last.layer, last.bytes) == (spec, "speculative", "wasted", 2, 100)


def test_io_trace_final_take_writes_unsettled_reads_as_unknown() -> None:
    tr = Tracing(io=True, compute=False)
    assert tr.io is not None
    rid = tr.io.record(0, 1, "ffn_gate_exps", 0, 10, kind="speculative")
    assert tr.io.take() == []
    (row,) = [ReadRow(*x) for x in tr.io.take(final=True)]
    assert (row.read, row.outcome, row.lane, row.finished_ns) == (rid, "unknown", -1, -1)


def test_compute_trace_cuts_a_token_at_callbacks_and_waits() -> None:
    tr = Tracing(io=False, compute=True)
    ct = tr.compute
    assert ct is not None

    def cb(t: int, ask: bool, ud: object) -> bool:
        if t == 1:
            ct.layer = 0  # a routing node
        if t == 2:
            a = time.perf_counter_ns()
            time.sleep(0.002)
            ct.wait(a, time.perf_counter_ns())
        return ask

    traced = ct.wrap(cb)
    tr.decode_begin()  # the prompt's batch, with no callbacks
    tr.decode_end()
    tr.decode_begin()  # token 1
    for node in (1, 2, 3):
        assert traced(node, True, None) is True
    tr.decode_end()
    rows = [Interval(*x) for x in ct.take()]
    assert [(r.step, r.layer, r.state) for r in rows] == [
        (0, -1, "compute"), (1, -1, "compute"), (1, 0, "hook"), (1, 0, "compute"), (1, 0, "hook"), (1, 0, "wait"),
        (1, 0, "hook"), (1, 0, "compute"), (1, 0, "hook"), (1, 0, "compute")]
    tok = rows[1:]
    assert all(a.end_ns == b.start_ns for a, b in zip(tok, tok[1:], strict=False))  # contiguous
    assert layer_totals(rows)[(0, 1, 1, 0)]["wait"] >= 2_000_000


# -- flags and campaigns --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["-m", "x", "--io-trace", "t.csv"], "--io-trace only applies with --moe-stream"),
    (["-m", "x", "--moe-stream", "--compute-trace", "t.csv", "--prompts-file", "p"], "cannot be combined with "
                                                                                     "--prompts-file"),
    (["-m", "x", "--moe-stream", "--io-trace", "t.csv", "--session"], "cannot be combined with --session"),
])
def test_flag_rules_are_one_line(argv: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_cli(argv)


TRACED = """\
name: tr
model: {recipe: {n_layer: 2}}
target: local
flags: {-t: 1, --moe-stream: true, --cache-mb: 0}
axes:
  - {flag: --cache-mb, values: [1]}
repeats: 1
tokens: 6
traces: true
"""


def test_a_traced_campaign_hands_every_run_its_trace_paths_and_hashes_differently(tmp_path: Path) -> None:
    plan = plan_campaign(write(tmp_path, TRACED))
    argv = engine_argv_tail(plan.campaign, plan.cells[1], model="m.gguf", csv="r.csv", progress=True,
                            io_trace="/t/r.io_trace.csv", compute_trace="/t/r.compute_trace.csv")
    assert argv[argv.index("--io-trace") + 1] == "/t/r.io_trace.csv"
    assert argv[argv.index("--compute-trace") + 1] == "/t/r.compute_trace.csv"
    plain = plan_record(plan_campaign(write(tmp_path, TRACED.replace("traces: true\n", ""), "p.yaml")))
    assert "traces" not in plain.dump() and plan_hash(plain) != plan_hash(plan_record(plan))


@pytest.mark.parametrize("change, message", [
    (("--cache-mb: 0}", "--cache-mb: 0, --io-trace: x.csv}"), "--io-trace is set by the harness from 'traces'"),
    (("--moe-stream: true, --cache-mb: 0}\naxes:\n  - {flag: --cache-mb, values: [1]}",
      "}\naxes:\n  - {flag: -t, values: [2]}"), "--io-trace only applies with --moe-stream"),
    (("target: local\n", "target: local\nengine: {kind: external, path: /bin/true}\n"),
     "traces: only engine bmoe writes --io-trace and --compute-trace"),
])
def test_traced_campaign_refusals(tmp_path: Path, change, message: str) -> None:
    got = errors(write(tmp_path, TRACED.replace(*change)))
    assert any(message in e for e in got), got


# -- engine -----------------------------------------------------------------------------------------------------

N = 16
LANES = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    spec = ModelSpec(expert_type="q8_0", seed=5, n_expert=16, n_expert_used=4)
    return make_model(tmp_path_factory.mktemp("trace") / "k4.gguf", spec)[0]


CELLS = {"cache": ("--moe-stream", "--cache-mb", "1", "--force-cache", "--io-threads", str(LANES)),
         "nocache": ("--moe-stream", "--cache-mb", "0", "--io-threads", str(LANES))}


@pytest.mark.engine
@pytest.mark.parametrize("cell", sorted(CELLS))
def test_traces_agree_with_the_csv_and_the_route_trace_and_change_no_output(model, tmp_path, cell) -> None:
    flags = CELLS[cell]
    base = bmoe(model, *flags, n=N, tmp=tmp_path)
    assert base.rc == 0, base.stderr
    io_p, ct_p, rt_p = tmp_path / "t.io.csv", tmp_path / "t.compute.csv", tmp_path / "t.route.csv"
    tr = bmoe(model, *flags, "--io-trace", str(io_p), "--compute-trace", str(ct_p), "--route-trace", str(rt_p),
              n=N, tmp=tmp_path)
    assert tr.rc == 0, tr.stderr
    assert tr.stdout == base.stdout and tr.tokens == base.tokens and len(tr.tokens) == N  # byte-identical output
    csv = read_metrics(sorted(tmp_path.glob("run-*.csv"))[-1])
    io, ct = read_io_trace(io_p), read_compute_trace(ct_p)  # the parser checks issued <= started <= finished
    assert "perturbs" in io.meta and "perturbs" in ct.meta and io.meta["io_threads"] == str(LANES)
    reads = io.rows
    assert all(r.finished_ns >= r.started_ns >= r.issued_ns > 0 and r.kind == "demand" and r.outcome == "used"
               for r in reads)
    assert {r.lane for r in reads} <= set(range(LANES))
    per_token = Counter()
    for r in reads:
        if r.phase == 1:
            per_token[r.step] += r.bytes
    assert [per_token[s] for s in range(1, N + 1)] == [int(b) for b in csv.col("read_bytes")]
    # every miss of the route trace has one read per expert tensor, and no read is of a hit
    n_tensors = len({r.tensor for r in reads})
    misses = {(r.phase, r.step, r.layer, r.expert) for r in read_route_trace(rt_p).rows
              if r.residency == 0 and r.phase == 1}
    got = Counter((r.phase, r.step, r.layer, r.expert) for r in reads if r.phase == 1)
    assert set(got) == misses and set(got.values()) == {n_tensors}
    # the compute trace covers each decode call without gaps; its waits are the CSV's stall
    by_step = defaultdict(list)
    for iv in ct.rows:
        by_step[(iv.phase, iv.step)].append(iv)
    assert sorted(s for p, s in by_step if p == 1) == list(range(1, N + 1))
    stall = csv.col("stall_ms")
    wall = csv.col("wall_ms")
    for s in range(1, N + 1):
        ivs = by_step[(1, s)]
        assert all(a.end_ns == b.start_ns for a, b in zip(ivs, ivs[1:], strict=False))
        assert {iv.layer for iv in ivs} == {-1, 0, 1, 2, 3}
        waited = sum(iv.end_ns - iv.start_ns for iv in ivs if iv.state == "wait") / 1e6
        assert abs(waited - stall[s - 1]) < 0.002
        assert (ivs[-1].end_ns - ivs[0].start_ns) / 1e6 <= wall[s - 1] + 0.001
    png = timeline_png(token_view(io, ct, median_step(ct)))
    assert png.startswith(PNG)


@pytest.mark.engine
def test_the_timeline_command_draws_a_token_and_refuses_a_missing_one(model, tmp_path) -> None:
    io_p, ct_p = tmp_path / "t.io.csv", tmp_path / "t.compute.csv"
    r = bmoe(model, *CELLS["nocache"], "--io-trace", str(io_p), "--compute-trace", str(ct_p), n=6, tmp=tmp_path)
    assert r.rc == 0, r.stderr
    out = tmp_path / "tl.png"
    p = subprocess.run([*BENCH, "timeline", "--io", str(io_p), "--compute", str(ct_p), "--token", "4", "-o", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert out.read_bytes().startswith(PNG) and "token 4" in p.stdout
    p = subprocess.run([*BENCH, "timeline", "--io", str(io_p), "--compute", str(ct_p), "--token", "40"],
                       capture_output=True, text=True)
    assert p.returncode != 0 and p.stderr.count("\n") == 1 and "token 40 is not in the compute trace" in p.stderr


@pytest.mark.engine
def test_a_traced_campaign_commits_reports_and_checks_its_traces(tmp_path) -> None:
    from harness.campaigns.runner import run_campaign
    from harness.report.build import check_report

    src = tmp_path / "tr.yaml"
    src.write_text(TRACED + textwrap.dedent("""\
        warmup_tokens: 1
        cooldown: {mem_available_min_mib: 64, max_wait_s: 5}
        timeout_s: 300
        """))
    res = run_campaign(src, root=tmp_path / "bench", console=quiet())
    assert res.n_ok == 2, res
    folder = res.folder
    p = subprocess.run([*BENCH, "report", str(folder)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    run = folder / "runs" / "r01-c01"
    assert {"io_trace.csv", "compute_trace.csv"} <= {x.name for x in run.iterdir()}
    assert (folder / "plots" / "timeline.png").read_bytes().startswith(PNG)
    assert "## Timeline (traced runs)" in (folder / "findings.md").read_text()
    assert check_report(folder) == []
    (folder / "plots" / "timeline.png").unlink()
    assert check_report(folder) == ["plots/timeline.png"]
    with open(run / "io_trace.csv", "a") as f:
        f.write("\n")
    assert "runs/r01-c01/io_trace.csv" in check_report(folder)


@pytest.mark.engine
def test_prefetch_reads_are_traced_as_speculative_and_settled(model, tmp_path) -> None:
    """With --prefetch and --predict-prefetch on an evicting cache, speculative reads get rows of their own
    (kind speculative, on the lanes, times filled) settled used or wasted; output unchanged by the trace."""
    flags = (*CELLS["cache"], "--prefetch", "1", "--predict-prefetch")
    base = bmoe(model, *flags, n=N, tmp=tmp_path)
    assert base.rc == 0, base.stderr
    io_p = tmp_path / "p.io.csv"
    tr = bmoe(model, *flags, "--io-trace", str(io_p), n=N, tmp=tmp_path)
    assert tr.rc == 0, tr.stderr
    assert tr.stdout == base.stdout and tr.tokens == base.tokens
    csv = read_metrics(sorted(tmp_path.glob("run-*.csv"))[-1])
    spec = [r for r in read_io_trace(io_p).rows if r.kind == "speculative"]
    bad = [r for r in spec if not (r.finished_ns >= r.started_ns >= r.issued_ns > 0 and r.lane < LANES)]
    assert spec and not bad, bad[:3]
    assert {r.outcome for r in spec} <= {"used", "wasted", "unknown"} and "used" in {r.outcome for r in spec}
    # every speculative read is in a token's prefetch_bytes, or (still in flight after the last token) in the
    # summary's prefetch_late_bytes
    late = int(csv.summary()["prefetch_late_bytes"])
    assert sum(r.length for r in spec) == sum(int(b) for b in csv.col("prefetch_bytes")) + late
