"""Identity across engines: bmoe and the C++ original (its `bmoe-cli`, built by scripts/build-peer.sh; the
tests skip without it) give the same greedy bytes and route every token to the same experts on the same
model and prompt; and `bmoe-bench replay` reproduces the hit rate the C++ engine records with its cache on
(its route trace, replayed through our LRU at its budget)."""

from __future__ import annotations

import contextlib
import csv
import io
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from harness.bench_cli import main as bench_main
from harness.formats.metrics_csv import read_metrics
from harness.formats.route_trace import read_route_trace
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.helpers.peer import peer_cli

pytestmark = pytest.mark.engine

BMOE = [sys.executable, "-m", "harness.engine.cli"]
PROMPT = "The expert cache keeps hot experts near."
N = 24
COMMON = ["-n", str(N), "-t", "1", "-c", "256", "--moe-stream", "--io-threads", "2"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    # the small shape: 8 layers, 32 experts, top-4, Q4_K experts, a byte-level vocabulary
    (p,) = make_model(tmp_path_factory.mktemp("peer") / "small.gguf", shape_spec("small"))
    return p


def _routes(path: Path) -> dict[tuple[int, int], list[tuple[int, ...]]]:
    """(phase, layer) -> the expert ids of each step, in step order (slot order kept)."""
    rows = defaultdict(lambda: defaultdict(list))
    for r in read_route_trace(path).rows:
        rows[(r.phase, r.layer)][r.step].append(r.expert)
    return {k: [tuple(v[s]) for s in sorted(v)] for k, v in rows.items()}


def _cxx_text(stdout: bytes) -> bytes:
    """The C++ engine's plain stdout is the prompt, the raw piece bytes, then a blank line and its report."""
    assert stdout.startswith(PROMPT.encode())
    return stdout[len(PROMPT):].rsplit(b"\n\ngeneration: ", 1)[0]


def test_same_greedy_bytes_and_same_experts_as_the_cxx_engine(model, tmp_path):
    cli = peer_cli()
    bt, ct = tmp_path / "bmoe.route.csv", tmp_path / "cxx.route.csv"
    # the C++ engine leaves flash attention at llama.cpp's default (auto); bmoe's default is off (exact verify
    # batches), so bmoe runs with llama.cpp's default here
    b = subprocess.run([*BMOE, "-m", str(model), "-p", PROMPT, *COMMON, "--cache-mb", "0", "--flash-attn", "auto",
                        "--csv", str(tmp_path / "b.csv"), "--route-trace", str(bt)], capture_output=True, timeout=600)
    assert b.returncode == 0, b.stderr.decode(errors="replace")
    c = subprocess.run([str(cli), "-m", str(model), "-p", PROMPT, *COMMON, "--cache-mb", "0",
                        "--csv", str(tmp_path / "c.csv"), "--route-trace", str(ct)], capture_output=True, timeout=600)
    assert c.returncode == 0, c.stderr.decode(errors="replace")
    ours, theirs = b.stdout.removesuffix(b"\n"), _cxx_text(c.stdout)
    assert len(read_metrics(tmp_path / "b.csv").token_ids()) == N
    assert ours == theirs and len(ours) >= N  # raw bytes, compared as the engines wrote them
    rb, rc = _routes(bt), _routes(ct)
    decode = sorted(k for k in rb if k[0] == 1)
    assert decode and decode == sorted(k for k in rc if k[0] == 1)
    for k in decode:  # every decoded token routed to the same experts in every layer
        assert [sorted(x) for x in rb[k]] == [sorted(x) for x in rc[k]], k


def test_our_replay_reproduces_the_hit_rate_the_cxx_engine_records(model, tmp_path):
    cli = peer_cli()
    budget = 24  # MiB: above one token cycle (8 layers x 4 x 0.44 MiB), far below the 113 MiB of experts
    trace, log, out = tmp_path / "cxx.route.csv", tmp_path / "cxx.log", tmp_path / "c.csv"
    c = subprocess.run([str(cli), "-m", str(model), "-p", PROMPT, *COMMON, "--cache-mb", str(budget),
                        "--force-cache", "--csv", str(out), "--route-trace", str(trace)],
                       capture_output=True, text=True, errors="replace", timeout=600)
    assert c.returncode == 0, c.stderr
    log.write_text(c.stdout)
    recorded = float(read_metrics(out).summaries[-1]["cache_hit_pct"])
    assert "evictions" in c.stdout and 5.0 < recorded < 95.0  # a cache that evicts, neither empty nor all hits
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert bench_main(["replay", str(trace), "--budgets", str(budget), "--policies", "lru",
                           "--format", "csv"]) == 0
    (row,) = list(csv.DictReader(io.StringIO(buf.getvalue())))
    assert abs(float(row["hit_pct"]) - recorded) < 0.05, (row, recorded)


def test_plain_stdout_keeps_a_pieces_raw_bytes_and_progress_lines_stay_json():
    from harness.engine.run.sinks import TextSink
    from harness.formats.metrics_csv import Summary, TokenRow
    from harness.formats.progress import parse_progress

    class Out(io.StringIO):
        buffer = io.BytesIO()
    piece = b"\xe2\x82"  # the first two bytes of a three-byte character: a token may end mid-character
    text = piece.decode("utf-8", "surrogateescape")  # as the engine hands it to its sinks
    out = Out()
    TextSink(out, progress=False).row(TokenRow(step=1, steps=1, wall_ms=1.0), text)
    assert out.buffer.getvalue() == piece and out.getvalue() == ""
    prog = io.StringIO()
    sink = TextSink(prog, progress=True)
    sink.row(TokenRow(step=1, steps=1, wall_ms=1.0), text)
    assert prog.getvalue() == ""  # the line waits for the rest of the character (test_engine_text.py)
    sink.finish(Summary())  # which never comes: the reply ends inside it
    assert parse_progress(prog.getvalue().strip())["text"] == "\ufffd"  # JSON carries text
