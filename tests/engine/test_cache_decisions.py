"""The cache's bookkeeping was made cheap without changing one decision: every online policy, driven as the
engine's hook drives it (deferred evictions), on both recorded traces and the synthetic top-8 routing, takes
exactly the decisions the implementation before that change took (its digests are pinned in
tests/fixtures/cache-decisions.json, written by
`python -m harness.replay.bookkeeping --write-digests <checkout of be5c036> tests/fixtures/cache-decisions.json`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.replay.bookkeeping import DIGEST_GRID, MIB, ONLINE, drive, workload

PINNED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "cache-decisions.json").read_text())


def test_the_pinned_grid_is_the_digest_grid() -> None:
    assert sorted(PINNED) == sorted(f"{w}/{p}/{b}" for w, bs in DIGEST_GRID.items() for b in bs for p in ONLINE)


@pytest.mark.parametrize("impl", ["compiled", "numpy"])
@pytest.mark.parametrize("name", list(DIGEST_GRID))
def test_every_policy_decides_as_before(name: str, impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both implementations: the compiled helper and the pure-Python (numpy) reference."""
    from harness.engine.cache.policies import native

    if impl == "compiled" and native._compiled is None:
        pytest.skip("the compiled helper is not built (harness/engine/native/_policyc)")
    monkeypatch.setattr(native, "_reference", impl == "numpy")
    w = workload(name)
    wrong = [f"{name}/{p}/{b}" for b in DIGEST_GRID[name] for p in ONLINE
             if drive(w, p, b * MIB)[1] != PINNED[f"{name}/{p}/{b}"]]
    assert not wrong, f"decisions changed: {wrong}"


def test_the_digest_tells_policies_apart_and_is_deterministic() -> None:
    w = workload("synth-top8")
    lru, lfu = drive(w, "lru", 1100 * MIB)[1], drive(w, "lfu", 1100 * MIB)[1]
    assert lru != lfu and lru == drive(w, "lru", 1100 * MIB)[1]


def test_replay_cost_measures_two_checkouts_side_by_side(tmp_path: Path, capsys) -> None:
    from harness.bench_cli import main

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "cost"
    assert main(["replay-cost", "--against", str(repo), "--out", str(out), "--workloads", "synth-top8",
                 "--policies", "lru", "--rounds", "2"]) == 0
    raw = (out / "raw.csv").read_text().splitlines()
    assert raw[0] == "impl,round,workload,policy,budget_mib,ns_per_token,digest" and len(raw) == 5
    summary = (out / "summary.csv").read_text().splitlines()
    assert summary[1].startswith("synth-top8,lru,2000,") and summary[1].endswith(",True")
    pure = tmp_path / "pure"
    assert main(["replay-cost", "--against", str(repo), "--out", str(pure), "--workloads", "synth-top8",
                 "--policies", "aged-markov", "--rounds", "1", "--pure"]) == 0
    raw = (pure / "raw.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in raw[1:]] == ["against", "pure", "this"]
    assert (pure / "summary.csv").read_text().splitlines()[0].split(",")[3:6] == [
        "against_ms_per_token", "pure_ms_per_token", "this_ms_per_token"]
    assert main(["replay-cost", "--against", str(tmp_path), "--out", str(out)]) == 2
    assert "no harness/engine/cache/expert_cache.py (or, before" in capsys.readouterr().err
