"""bmoe-bench mincap over real capped runs (real cgroups: root): the minimum cap of a program of known footprint
(tests/helpers/memhog.py holds N MiB) is at least N and moves by N's difference; the runs it made are stored; a
command that cannot run is one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from harness.bench_cli import main as bench_main
from harness.errors import UserError
from harness.formats import mincap as fmt
from harness.memcap.runner import Plan, find_min_cap

HOG = str(Path(__file__).resolve().parents[1] / "helpers" / "memhog.py")


def _cgroups() -> str | None:
    from harness.targets.cgroup import CappedCgroup, locate_self

    try:
        with CappedCgroup(locate_self(), 64):
            return None
    except (UserError, OSError) as e:
        return str(e)


pytestmark = pytest.mark.skipif(_cgroups() is not None, reason="no usable memory cgroup here")


def _hog(mib: int) -> list[str]:
    return [sys.executable, HOG, "--mib", str(mib), "-n", "4"]


def test_min_cap_follows_a_known_footprint(tmp_path: Path):
    said: list[str] = []
    caps = {}
    for mib in (48, 144):
        rec = find_min_cap(Plan(f"hog{mib}", _hog(mib), tmp_path, resolution=8, lo=16, roomy_mib=1024), said.append)
        caps[mib] = rec["min_cap_mib"]
        assert rec["fails_at_mib"] == rec["min_cap_mib"] - 8, rec["note"]
        assert mib < rec["min_cap_mib"] <= mib + 128  # the held memory plus an interpreter
    assert 96 - 16 <= caps[144] - caps[48] <= 96 + 16
    recs = fmt.read(tmp_path / fmt.FILE)
    probes = [r for r in recs if r["record"] == "probe" and r["label"] == "hog144"]
    assert probes[0]["cap_mib"] == 1024 and probes[0]["runs"]  # the roomy run first
    failed = [r for r in probes if not r["runs"]]
    assert failed and all(r["oom_kills"] > 0 or r["exit_code"] != 0 for r in failed)
    at_min = [r for r in probes if r["cap_mib"] == caps[144]]
    assert at_min and all(r["runs"] and r["peak_mib"] <= caps[144] for r in at_min)
    assert [r["min_cap_mib"] for r in recs if r["record"] == "search"] == [caps[48], caps[144]]
    assert any("minimum cap" in s for s in said)


def test_the_command_line_finds_it_and_refuses_a_command_without_a_token_count(tmp_path: Path, capsys):
    rc = bench_main(["mincap", "--label", "hog", "--out", str(tmp_path), "--lo", "16", "--roomy", "512",
                     "--resolution", "16", "--", *_hog(32)])
    assert rc == 0
    assert "hog: minimum cap" in capsys.readouterr().out
    rc = bench_main(["mincap", "--label", "x", "--out", str(tmp_path), "--", sys.executable, HOG, "--mib", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and "give the engine command a token count" in err and "\n" == err[-1] and err.count("\n") == 1
