"""harness.formats.fidelity: the reference file and the per-position CSV round-trip; damaged, newer or foreign files
are refused with one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.errors import UserError
from harness.formats import fidelity as ff

HEADER = {"n_vocab": 50, "ctx": 8, "first": 4, "n_chunk": 2, "top_k": 5, "bos": 1, "arch": "olmoe"}


def _write(path: Path) -> tuple[np.ndarray, dict]:
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    w = ff.RefWriter(path, HEADER, tokens)
    rng = np.random.default_rng(0)
    rows = {}
    for c in range(2):
        n = ff.scored_per_chunk(8, 4)
        part = dict(ids=rng.integers(0, 50, (n, 5)), lp=rng.normal(size=(n, 5)), tail_lp=rng.normal(size=n),
                    next_lp=rng.normal(size=n))
        w.rows(**part)
        rows[c] = part
    w.close()
    return tokens, rows


def test_reference_round_trip(tmp_path: Path):
    p = tmp_path / "r.ref"
    tokens, rows = _write(p)
    r = ff.read_ref(p)
    assert r.header == HEADER and r.ctx == 8 and r.first == 4
    assert (r.tokens == tokens).all()
    for c in range(2):
        got = r.chunk_rows(c)
        assert (got["ids"] == rows[c]["ids"]).all()
        assert np.array_equal(got["lp"], rows[c]["lp"].astype(np.float32))
        assert np.array_equal(got["next_lp"], rows[c]["next_lp"].astype(np.float32))
    assert ff.read_ref_header(p) == HEADER
    assert not list(tmp_path.glob(".*.tmp"))


def test_a_short_reference_is_not_renamed_into_place(tmp_path: Path):
    p = tmp_path / "r.ref"
    w = ff.RefWriter(p, HEADER, np.zeros((2, 8), np.int32))
    w.rows(np.zeros((3, 5)), np.zeros((3, 5)), np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="3 rows written, 6 declared"):
        w.close()
    assert not p.exists() and not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-3], "truncated or damaged"),
    (lambda b: b.replace(b"bmoe_fidelity_ref v1", b"bmoe_fidelity_ref v2", 1), "is not v1"),
    (lambda b: b"hello\n" + b, "not a bmoe_fidelity_ref file"),
    (lambda b: b.replace(b'"ctx": 8', b'"ctx": "x"', 1), "header line is damaged"),
])
def test_damaged_references_are_refused(tmp_path: Path, damage, message):
    p = tmp_path / "r.ref"
    _write(p)
    p.write_bytes(damage(p.read_bytes()))
    with pytest.raises(UserError, match=message) as e:
        ff.read_ref(p)
    assert "\n" not in str(e.value)


def test_missing_reference(tmp_path: Path):
    with pytest.raises(UserError, match="cannot read it"):
        ff.read_ref(tmp_path / "nope.ref")


def test_csv_round_trip(tmp_path: Path):
    p = tmp_path / "f.csv"
    w = ff.FidelityCsvWriter(p, {"reference": "r.ref", "cfg.moe_stream": True})
    kl = np.array([0.0, 0.25, 1e-9])
    lp_ref = np.log(np.array([0.5, 0.1, 0.2], dtype=np.float32))
    lp_run = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    w.rows(3, 4, np.array([7, 8, 9]), np.array([1, 2, 3]), np.array([1, 5, 9]), kl, np.array([0.5, 0.1, 0.2]),
           np.array([0.5, 0.3, 0.2]), lp_ref, lp_run)
    w.close()
    f = ff.read_fidelity_csv(p)
    assert f.meta == {"reference": "r.ref", "cfg.moe_stream": "True"}
    assert f.columns["pos"].tolist() == [4, 5, 6] and f.columns["same_top"].tolist() == [1, 0, 0]
    assert np.array_equal(f.columns["kld"], kl)
    assert f.columns["dp"][1] == pytest.approx(0.2)
    # v2: the log-probabilities exactly as float32 gave them, and whether the run's top token is the text's
    assert np.array_equal(f.columns["lp_ref"], lp_ref.astype(np.float64))
    assert np.array_equal(f.columns["lp_run"], lp_run.astype(np.float64))
    assert f.columns["hit"].tolist() == [0, 0, 1]
    v1 = p.read_text().replace("bmoe_fidelity v2", "bmoe_fidelity v1").splitlines()
    cut = [ln if ln.startswith("#") else ",".join(ln.split(",")[:10]) for ln in v1]
    p.write_text("\n".join(cut) + "\n")  # a v1 file (before --fidelity-decode): read without the v2 columns
    old = ff.read_fidelity_csv(p)
    assert "lp_run" not in old.columns and np.array_equal(old.columns["kld"], kl)
    p.write_text(p.read_text().replace("bmoe_fidelity v1", "bmoe_fidelity v9"))
    with pytest.raises(UserError, match="not a bmoe_fidelity v1 or v2 file"):
        ff.read_fidelity_csv(p)
