"""Shards across labs (issue 24 item 5): `run --shard K/N` runs whole rounds of the plan in a folder of its own;
`merge` joins the shards' folders into one campaign folder, every raw file checked against its sha256, folders
of another plan refused one line each, nothing written outside --out; and the merged folder's report is what an
unsharded run of the same runs gives. Real runs of the fake engine (a real process writing real CSVs): its
per-token times are seeded by the run's id, so the same run gives the same figures in any folder."""

from __future__ import annotations

import re
import shutil
import textwrap
import time
from pathlib import Path

import pytest

from harness.bench_cli import main
from harness.campaigns.merge import MergeError, merge_folders
from harness.campaigns.runner import run_campaign
from harness.campaigns.shard import Shard
from harness.errors import UserError
from harness.formats.files import sha256_file
from harness.formats.manifest import load_manifest, save_manifest
from harness.report.build import build_report, check_report
from harness.targets.sim import SimTarget
from tests.helpers.runner import engine, quiet


def _campaign(d: Path, *, repeats: int = 4, extra: str = "") -> Path:
    exe = engine(d)
    model = d / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = d / "t.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: t
        model: {{path: {model}}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10, --noise: 0.1}}
        repeats: {repeats}
        tokens: 6
        warmup_tokens: 1
        order: alternating
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes:
          - flag: --speed
            values: [14]
        """) + extra)
    return p


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One campaign run whole, and as shards 1/2 and 2/2 in folders of their own (as on two machines)."""
    d = tmp_path_factory.mktemp("shards")
    p = _campaign(d)
    whole = run_campaign(p, root=d / "whole", console=quiet()).folder
    s1 = run_campaign(p, root=d / "lab1", console=quiet(), shard=Shard(1, 2)).folder
    s2 = run_campaign(p, root=d / "lab2", console=quiet(), shard=Shard(2, 2)).folder
    return d, p, whole, s1, s2


def _tree(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): sha256_file(p) for p in sorted(d.rglob("*")) if p.is_file()}


def _measured_here(findings: str) -> str:
    """findings.md without what a run measures of its machine (start times, wall times, entry state): the run
    order table keeps each run's id, cell, round and status, in run-id order."""
    out, rows, section = [], [], ""
    for line in findings.splitlines():
        if line.startswith("## "):
            section = line
        if section == "## Run order and entry state" and re.match(r"\| \d+ \| r\d", line):
            cols = [c.strip() for c in line.strip("|").split("|")]
            rows.append(" ".join([cols[1], cols[2], cols[3], cols[6]]))
            continue
        out.append(line)
    return "\n".join(out + sorted(rows))


def test_a_shard_runs_whole_rounds_with_the_whole_plans_hash(runs):
    _, _, whole, s1, s2 = runs
    mw, m1, m2 = (load_manifest(f) for f in (whole, s1, s2))
    assert m1.plan_hash == m2.plan_hash == mw.plan_hash
    assert (m1.shard, m2.shard) == ("1/2", "2/2") and mw.shard is None and "shard" not in mw.dump()
    assert sorted({r.round for r in m1.runs}) == [0, 2] and sorted({r.round for r in m2.runs}) == [1, 3]
    assert all(r.status == "ok" for r in m1.runs + m2.runs)
    assert sorted(r.run_id for r in m1.runs + m2.runs) == sorted(r.run_id for r in mw.runs)
    assert m1.status == m2.status == "complete"
    assert "**Shard 1/2** of the plan" in build_report(s1, with_plots=False).texts["findings.md"]


def test_the_merged_folders_report_is_the_unsharded_runs(runs, tmp_path, capsys):
    d, _, whole, s1, s2 = runs
    before = {f: _tree(f) for f in (s1, s2)}
    around = sorted(p for p in d.rglob("*"))
    out = tmp_path / "merged" / whole.name
    assert main(["merge", str(s2), str(s1), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert f"merged 2 folder(s) (shards 1/2, 2/2): 8 finished runs -> {out}" in said
    assert {f: _tree(f) for f in (s1, s2)} == before  # the shards' folders only read
    assert sorted(p for p in d.rglob("*")) == around  # nothing written beside them
    mm, mw = load_manifest(out), load_manifest(whole)
    assert mm.status == "complete" and mm.plan_hash == mw.plan_hash and "shard" not in mm.dump()
    assert mm.devices is None and all(r.device is None for r in mm.runs)  # one machine: no device labels
    key = [(r.run_id, r.round, r.cell, r.position, r.status, r.tokens, r.tok_s_all, r.sha256["metrics.csv"])
           for r in mw.runs]
    assert [(r.run_id, r.round, r.cell, r.position, r.status, r.tokens, r.tok_s_all, r.sha256["metrics.csv"])
            for r in mm.runs] == key  # the same runs, in the plan's order
    assert len(mm.sessions) == 2
    merged, unsharded = build_report(out, with_plots=False).texts, build_report(whole, with_plots=False).texts
    assert merged["results.csv"] == unsharded["results.csv"]
    assert _measured_here(merged["findings.md"]) == _measured_here(unsharded["findings.md"])
    assert check_report(out) == []  # the report the merge wrote is the folder's
    assert main(["report", str(out), "--check"]) == 0


def test_merge_refuses_another_plan_a_changed_file_and_a_shard_twice(runs, tmp_path, capsys):
    d, p, _, s1, s2 = runs
    other = run_campaign(p, root=d / "lab3", console=quiet(), shard=Shard(2, 2), overrides=["tokens=5"]).folder
    bad = tmp_path / "bad"
    shutil.copytree(s2, bad)
    (bad / "runs" / "r02-c01" / "metrics.csv").write_text("step\n")
    twice = tmp_path / "twice"
    shutil.copytree(s1, twice)
    seen = {f: _tree(f) for f in (s1, other, bad, twice)}
    out = tmp_path / "m"
    assert main(["merge", str(s1), str(other), str(twice), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and err[-1] == "Error: merge: 3 problems (listed above); nothing was written"
    assert any(x.startswith(f"{other}: plan ") and "a folder of another plan is not merged" in x for x in err)
    assert any(x.startswith(f"{twice}: holds shard 1/2, as {s1} does") for x in err)
    assert f"{twice}: run(s) r01-c00 r01-c01 r03-c00 r03-c01 are finished there and in {s1}; a run belongs to one " \
           "shard: leave one of the folders out" in err
    assert not out.exists()
    with pytest.raises(MergeError) as e:
        merge_folders([s1, bad], out)
    assert e.value.lines == [f"{bad}/runs/r02-c01/metrics.csv: changed since the run was committed (sha256 in "
                             f"{bad}/manifest.json); restore it as committed, or leave that folder out"]
    assert not out.exists()
    assert {f: _tree(f) for f in (s1, other, bad, twice)} == seen
    out.mkdir()
    (out / "x").write_text("mine")
    with pytest.raises(MergeError, match="already exists and is not an empty folder"):
        merge_folders([s1, s2], out)
    assert (out / "x").read_text() == "mine"


def test_merge_checks_a_shard_where_it_lies_before_copying_anything(runs, tmp_path):
    """A crafted shard: a sparse 200 GB file in a run's folder (not in its manifest). It is refused in one line
    from its size, before any copy (the copy would have written 200 GB), and --out is never made."""
    d, p, _, s1, s2 = runs
    bad = tmp_path / "bad"
    shutil.copytree(s2, bad)
    with (bad / "runs" / "r02-c01" / "huge.bin").open("wb") as f:
        f.truncate(200 * 10**9)
    out = tmp_path / "m"
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"huge\.bin.*larger than") as e:
        merge_folders([s1, bad], out)
    assert time.monotonic() - t0 < 30 and "\n" not in str(e.value)
    assert not out.exists()


def test_shards_from_two_machines_keep_their_machine_and_the_report_tests_it(runs, tmp_path):
    _, _, _, s1, s2 = runs
    other = tmp_path / "lab2"
    shutil.copytree(s2, other)
    m = load_manifest(other)
    m.target.hostname, m.target.cpus = "lab2-host", 64  # as the other lab's machine describes itself
    save_manifest(other, m)
    res = merge_folders([s1, other], tmp_path / "m")
    here = load_manifest(s1).target.hostname
    assert res.devices == sorted([here, "lab2-host"])
    mm = load_manifest(res.folder)
    assert {r.run_id: r.device for r in mm.runs} == {
        **{r.run_id: here for r in load_manifest(s1).runs}, **{r.run_id: "lab2-host" for r in m.runs}}
    assert mm.devices["lab2-host"]["cpus"] == 64
    dev = build_report(res.folder, with_plots=False).texts["findings.md"].split("## Devices\n\n", 1)[1]
    assert dev.startswith("The runs of one matrix were shared by 2 devices (spread):")
    assert "analysis of variance of log tok/s across devices within each cell, pooled over 2 cell(s): F(2, 4)" in dev


def _lab_campaign(d: Path, lab: str, files: Path) -> Path:
    """A spread fleet campaign over this lab's two devices; the model and engine in the lab's own folder (the
    same files, copied: as each host keeps its own copy)."""
    d.mkdir(parents=True)
    for name in ("model.bin", "fake-engine"):
        shutil.copy2(files / name, d / name)
    p = d / "t.yaml"
    p.write_text(_campaign(files).read_text().replace(str(files), str(d)) + textwrap.dedent(f"""\
        targets:
          - {{serial: s0, label: {lab}-a}}
          - {{serial: s1, label: {lab}-b}}
        fleet: {{use: spread, device_grace_s: 5}}
        """))
    return p


def test_each_labs_fleet_runs_its_shard_and_merge_joins_them(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    _campaign(files)
    folders = []
    for k, lab in ((1, "lab1"), (2, "lab2")):
        p = _lab_campaign(tmp_path / lab, lab, files)
        folders.append(run_campaign(p, root=tmp_path / lab / "bd", console=quiet(), shard=Shard(k, 2),
                                    fleet_target=lambda d: SimTarget(d.label, run_s=0.01)).folder)
    m1, m2 = (load_manifest(f) for f in folders)
    assert m1.plan_hash != m2.plan_hash and (m1.shard, m2.shard) == ("1/2", "2/2")  # each lab's devices in its plan
    assert {r.device for r in m1.runs} <= {"lab1-a", "lab1-b"} and {r.device for r in m2.runs} <= {"lab2-a", "lab2-b"}
    res = merge_folders(folders, tmp_path / "merged")
    assert res.devices == ["lab1-a", "lab1-b", "lab2-a", "lab2-b"] and res.n_finished == 8 and not res.pending
    mm = load_manifest(res.folder)
    assert mm.status == "complete" and mm.plan_hash == m1.plan_hash
    assert [r.device for r in mm.runs] == [r.device for r in sorted(m1.runs + m2.runs, key=lambda r: r.position)]
    dev = build_report(res.folder, with_plots=False).texts["findings.md"].split("## Devices\n\n", 1)[1]
    assert dev.startswith("The runs of one matrix were shared by 4 devices (spread):")


def test_a_missing_shard_leaves_its_runs_pending_for_a_resume(runs, tmp_path, capsys):
    _, p, whole, s1, _ = runs
    root = tmp_path / "bd"
    out = root / whole.name
    assert main(["merge", str(s1), "--out", str(out), "--no-report"]) == 0
    assert "4 planned run(s) are in no folder given" in capsys.readouterr().out
    m = load_manifest(out)
    assert m.status == "incomplete" and [r.status for r in m.runs].count("pending") == 4
    res = run_campaign(p, root=root, console=quiet())  # the plain command finishes the merged folder
    assert res.folder == out and (res.n_ok, res.n_skipped) == (8, 4)


def test_a_shard_resumes_as_that_shard_only(tmp_path):
    p = _campaign(tmp_path, repeats=2)
    root = tmp_path / "bd"
    a = run_campaign(p, root=root, console=quiet(), shard=Shard(1, 2))
    m = load_manifest(a.folder)
    m.status = "interrupted"
    save_manifest(a.folder, m)
    b = run_campaign(p, root=root, console=quiet(), shard=Shard(2, 2))
    assert b.folder != a.folder and load_manifest(b.folder).shard == "2/2"
    c = run_campaign(p, root=root, console=quiet(), shard=Shard(1, 2))
    assert c.folder == a.folder and c.n_skipped == 2


@pytest.mark.parametrize("text, extra, message", [
    ("3/2", "", r"--shard 3/2: give K/N, shard K of N with 1 <= K <= N"),
    ("two", "", r"--shard two: give K/N"),
    ("3/3", "", r"--shard 3/3: the plan has 2 round\(s\) \(repeats: 2\) and a shard runs whole rounds"),
    ("1/2", "precision: {ratio_half_width: 0.1, max_repeats: 4}\n", r"--shard 1/2: campaign t has precision:"),
])
def test_shards_that_cannot_stand_alone_are_refused_in_one_line(tmp_path, capsys, text, extra, message):
    p = _campaign(tmp_path, repeats=2, extra=extra)
    assert main(["run", str(p), "--out", str(tmp_path / "bd"), "--shard", text]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(message, err[0]), err
    assert not (tmp_path / "bd").exists() or not any((tmp_path / "bd").glob("*-t"))


def test_shard_parse():
    assert str(Shard.parse(" 2/3 ")) == "2/3" and Shard(2, 3).takes(1) and not Shard(2, 3).takes(2)
    with pytest.raises(UserError):
        Shard.parse("0/3")
