"""Gates of one-token scoring (`--fidelity-decode`, harness.engine.run.fidelity): each chunk decoded one token at a
time, as generation decodes, so that decode-time knobs act while a text is scored.

- lossless: a streamed run (an evicting cache with read-ahead, and no cache at all) gives the resident reference's
  log-probability of every next token and its top token exactly (KLD 0);
- deterministic lossy knobs (--route-ahead, --n-expert-used): streamed equals resident at the same value, and
  differs from the model's own (the measure can fail);
- --drop-cold-experts (decided by the cache, so not resident-reproducible): the resident run replaying a streamed
  run's recorded drops (--drop-replay) gives that run's figures exactly; F = 0 is exactly off; F = 1 moves them;
- and the reason for the mode: on the same text, cache and rule, one-token scoring drops many slots where the
  batched scoring (one prompt batch per chunk, drops in prefill) drops few, read from the route trace's
  `dropped` column.
A synthetic qwen3moe with the trained model's routing shape (32 experts, top-4), -t 1 (fast on a busy machine)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from harness.formats.fidelity import FidelityCsv, read_fidelity_csv
from harness.formats.route_trace import DECODE, PREFILL, read_route_trace
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.helpers.fidelity import text

pytestmark = pytest.mark.engine

BMOE = [sys.executable, "-m", "harness.engine.cli"]
CTX = 48  # two chunks: 2 x 23 scored positions, 2 x 47 one-token decodes
EVICT = ("--moe-stream", "--cache-mb", "1", "--force-cache")  # far below a token cycle: most lookups miss


@dataclasses.dataclass
class Run:
    rc: int
    stderr: str
    csv: FidelityCsv | None


def _bmoe(model: Path, *flags: str, tmp: Path, csv: bool = False) -> Run:
    out = tmp / f"run-{len(list(tmp.glob('run-*.csv')))}.csv"
    extra = ("--fidelity-csv", str(out)) if csv else ()
    p = subprocess.run([*BMOE, "-m", str(model), "-t", "1", *flags, *extra], capture_output=True, text=True,
                       errors="replace", timeout=300)
    return Run(p.returncode, p.stderr, read_fidelity_csv(out) if csv and p.returncode == 0 else None)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(folder, model, the text, the plain resident one-token reference)."""
    d = tmp_path_factory.mktemp("fid-decode")
    spec = dataclasses.replace(shape_spec("tiny"), n_expert=32, n_expert_used=4, seed=33)
    (model,) = make_model(d / "m.gguf", spec)
    t = text(60)
    ref = d / "plain.ref"
    r = _bmoe(model, "-p", t, "-c", str(CTX), "--fidelity-chunks", "2", "--fidelity-decode", "--fidelity-ref",
              str(ref), tmp=d)
    assert r.rc == 0, r.stderr
    assert "(one token at a time)" in r.stderr and "next-token accuracy" in r.stderr
    return d, model, t, ref


def _against(setup, ref: Path, *flags: str) -> FidelityCsv:
    d, model, _, _ = setup
    r = _bmoe(model, "--fidelity-against", str(ref), "--fidelity-decode", *flags, tmp=d, csv=True)
    assert r.rc == 0, r.stderr
    assert r.csv is not None and len(r.csv.columns["kld"]) == 2 * (CTX - 1 - CTX // 2)
    return r.csv


def _exact(c: FidelityCsv) -> None:
    col = c.columns
    assert np.all(col["kld"] == 0.0), f"KLD above 0 at {np.flatnonzero(col['kld'])[:5]}"
    assert np.array_equal(col["lp_run"], col["lp_ref"]) and np.all(col["same_top"] == 1)
    assert np.array_equal(col["hit"], (col["ref_top"] == col["token"]).astype(np.int64))


@pytest.mark.parametrize("knobs", [(*EVICT, "--prefetch", "1", "--io-threads", "2"), ("--moe-stream", "--cache-mb",
                                                                                      "0")])
def test_one_token_scoring_streamed_equals_resident(setup, knobs):
    _exact(_against(setup, setup[3], *knobs))


@pytest.mark.parametrize("knob", [("--route-ahead", "1"), ("--n-expert-used", "2")])
def test_deterministic_lossy_knob_streamed_equals_resident(setup, knob):
    d, model, t, plain = setup
    ref = d / f"knob{knob[0]}.ref"
    r = _bmoe(model, "-p", t, "-c", str(CTX), "--fidelity-chunks", "2", "--fidelity-decode", *knob, "--fidelity-ref",
              str(ref), tmp=d)
    assert r.rc == 0, r.stderr
    _exact(_against(setup, ref, *EVICT, *knob))
    moved = _against(setup, plain, *knob).columns  # the knob against the model's own: the measure can fail
    assert moved["kld"].mean() > 1e-3 and not np.array_equal(moved["lp_run"], moved["lp_ref"])


def test_drop_cold_streamed_equals_resident_under_its_drops(setup):
    d, _, _, plain = setup
    trace = d / "drops.route.csv"
    streamed = _against(setup, plain, *EVICT, "--drop-cold-experts", "1.0", "--route-trace", str(trace))
    assert streamed.columns["kld"].mean() > 1e-3  # F = 1 drops, and the figures move
    tr = read_route_trace(trace)
    assert sum(r.dropped for r in tr.rows) > 0 and {r.turn for r in tr.rows} == {0, 1}  # a turn per chunk
    replayed = _against(setup, plain, "--drop-replay", str(trace))  # resident, the streamed run's drops replayed
    for k in ("kld", "lp_run", "run_top", "hit"):
        assert np.array_equal(streamed.columns[k], replayed.columns[k]), k
    _exact(_against(setup, plain, *EVICT, "--drop-cold-experts", "0"))  # the neutral value is off


def _dropped_share(path: Path, phase: int) -> float:
    rows = [r for r in read_route_trace(path).rows if r.phase == phase]
    assert rows
    return sum(r.dropped for r in rows) / len(rows)


def test_one_token_scoring_drops_where_batches_hide_it(setup):
    """Batched, an expert is dropped only when every token of the chunk routing to it qualifies: on the same text,
    cache and rule, the one-token scoring drops several times the share of slots."""
    d, model, t, _ = setup
    bref = d / "batch.ref"
    r = _bmoe(model, "-p", t, "-c", str(CTX), "--fidelity-chunks", "2", "--fidelity-ref", str(bref), tmp=d)
    assert r.rc == 0, r.stderr
    bt, dt = d / "batch.route.csv", d / "decode.route.csv"
    r = _bmoe(model, "--fidelity-against", str(bref), *EVICT, "--drop-cold-experts", "1.0", "--drop-in-prefill",
              "--route-trace", str(bt), tmp=d, csv=True)
    assert r.rc == 0, r.stderr
    _against(setup, setup[3], *EVICT, "--drop-cold-experts", "1.0", "--route-trace", str(dt))
    batched, one = _dropped_share(bt, PREFILL), _dropped_share(dt, DECODE)
    assert one > 0.2 and one > 3 * batched, (one, batched)


def test_a_reference_and_its_runs_use_one_mode(setup):
    d, model, t, plain = setup
    r = _bmoe(model, "--fidelity-against", str(plain), tmp=d)
    last = r.stderr.strip().splitlines()[-1]
    assert r.rc == 2 and last.startswith("bmoe: error: ")
    assert "scored one token at a time: add --fidelity-decode" in last
    assert r.stderr.count("error") == 1
