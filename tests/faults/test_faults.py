"""Fault injection on the campaign runner, one test per fault, with real processes: two `bmoe-bench run`
on one folder (staggered and together), SIGTERM and kill -9 of a runner (and at random points, bounded),
and the messages a user is given. Disk full: test_faults_disk.py; broken raw files and manifests:
test_faults_files.py; the engine's own faults: test_faults_engine.py."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import time
from pathlib import Path

from tests.helpers.faults import (
    _children,
    _cmdline,
    _state,
    bench,
    check_ok,
    cli,
    error_line,
    folders,
    held,
    in_flight,
    manifest_runs,
    start,
)
from tests.helpers.runner import campaign, wait_for

# ---- 1. two runners, one folder --------------------------------------------------------------------------------

def test_second_runner_on_a_live_folder_is_refused_naming_the_first(tmp_path):
    p, gate = held(tmp_path, repeats=2)
    out = tmp_path / "bd"
    a = start("run", p, "--out", out)
    try:
        folder = wait_for(lambda: (folders(out) or [None])[0], timeout=120)
        wait_for(lambda: in_flight(folder), timeout=120)  # staggered: the first is in its first run
        b = bench("run", p, "--out", out)
        assert b.returncode == 75, b.stderr
        line = error_line(b.stderr)
        assert f"PID {a.pid}" in line and str(folder) in line, line
        assert in_flight(folder)  # its half-written run untouched
    finally:
        gate.touch()
        a_out, a_err = a.communicate(timeout=300)
    assert a.returncode == 0, a_err
    assert folders(out) == [folder]
    assert all(r["status"] == "ok" for r in manifest_runs(folder).values())
    check_ok(folder)


def test_two_runners_started_together_one_runs_the_other_is_refused(tmp_path):
    p, gate = held(tmp_path, repeats=1)
    out = tmp_path / "bd"
    procs = [start("run", p, "--out", out) for _ in range(2)]
    wait_for(lambda: any(x.poll() is not None for x in procs), timeout=300)  # the loser, while the winner waits
    gate.touch()
    res = [(x, *x.communicate(timeout=300)) for x in procs]
    assert sorted(x.returncode for x, _, _ in res) == [0, 75], [e for _, _, e in res]
    (winner, _, _), = [r for r in res if r[0].returncode == 0]
    (_, _, lost_err), = [r for r in res if r[0].returncode == 75]
    assert f"PID {winner.pid}" in error_line(lost_err)
    (folder,) = folders(out)
    assert all(r["status"] == "ok" for r in manifest_runs(folder).values())
    check_ok(folder)



# ---- 5. true messages -------------------------------------------------------------------------------------------

def test_the_resume_hint_after_sigterm_is_the_whole_command_and_it_resumes(tmp_path):
    p, gate = held(tmp_path, repeats=2)  # its first run waits at the gate: the signal lands mid-campaign
    out = tmp_path / "bd"
    a = start("run", p, "--out", out, "--set", "tokens=6")
    folder = wait_for(lambda: (folders(out) or [None])[0], timeout=120)
    wait_for(lambda: in_flight(folder), timeout=120)
    a.send_signal(signal.SIGTERM)
    _, err = a.communicate(timeout=60)
    gate.touch()
    assert a.returncode == 130, err
    line = error_line(err)
    cmd = line.split("`")[1]
    assert cmd == f"bmoe-bench run {p} --out {out} --set tokens=6", line
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = bench(*shlex.split(cmd)[1:], cwd=elsewhere)  # followed to the letter, from another directory
    assert r.returncode == 0, r.stderr
    assert "resuming" in r.stderr and list(elsewhere.iterdir()) == []
    check_ok(folder)


def test_failed_runs_get_the_same_advice_from_the_cli_and_the_findings(tmp_path):
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    out = tmp_path / "bd"
    r = cli("run", p, "--out", out)
    assert r.returncode == 1
    said = error_line(r.stderr)
    assert f"`bmoe-bench run {p} --out {out} --retry-failed`" in said, said
    md = (folders(out)[0] / "findings.md").read_text()
    (warn,) = [x for x in md.splitlines() if x.startswith("- failed:")]
    assert f"`bmoe-bench run {p} --retry-failed`" in warn and "--out the folder that holds this one" in warn
    assert "same command again" not in md


def test_a_temporary_csv_path_is_never_a_configuration_column(tmp_path):
    from harness.report.build import build_report
    from tests.helpers.folders import TWO, csv_text, make_folder

    runs = [(c, 0, csv_text([999, 100 / (c + 1), 100, 100], preamble={"cfg.fast": str(bool(c)),
                                                                     "cfg.csv": f"/tmp/bmoe-run-{c}/r.csv"}))
            for c in (0, 1)]
    folder = make_folder(tmp_path, TWO, runs, repeats=1)
    header = build_report(folder, with_plots=False).texts["results.csv"].splitlines()[1].split(",")
    assert "cfg.fast" in header and "cfg.csv" not in header


def test_a_runner_killed_with_9_leaves_no_engine_and_no_temp_dir_after_the_next_run(tmp_path):
    p, gate = held(tmp_path, repeats=1)
    out = tmp_path / "bd"
    a = start("run", p, "--out", out)
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    try:
        left = wait_for(lambda: list(tmp.glob(f"bmoe-run-{a.pid}-*")), timeout=120)
        engines = wait_for(lambda: [c for c in _children(a.pid) if b"--hold" in _cmdline(c)], timeout=120)
        wait_for(lambda: any("BMOE_PROGRESS" in x.read_text() for x in out.glob("*/runs/.*.tmp/engine.log")),
                 timeout=120)  # the engine is past its first token, waiting at the gate, silent
        a.kill()
        a.communicate(timeout=30)
        assert all(d.is_dir() for d in left)
        wait_for(lambda: all(_state(pid) in ("gone", "z (zombie)") for pid in engines),
                 timeout=10)  # the engine died with its runner: nothing competes with the next run
    finally:
        gate.touch()
    r = bench("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    assert not any(d.exists() for d in left)


def test_a_signal_kill_reason_has_no_unrelated_stderr_line():
    from harness.targets.base import exit_reason

    assert exit_reason(-signal.SIGKILL, "bmoe: dense weights anon: 39 tensors") == "engine killed by SIGKILL"
    assert exit_reason(-signal.SIGTERM, "loading") == "engine killed by SIGTERM"
    assert exit_reason(3, "bmoe: error: boom") == "engine exited 3: bmoe: error: boom"


def test_an_empty_axis_says_so(tmp_path):
    p = campaign(tmp_path)
    p.write_text(p.read_text().replace("values: [20]", "values: []"))
    r = cli("validate", p)
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert "axes[0].values must not be empty" in line and "got a list" not in line



# ---- 6. kill -9 and SIGTERM at random points, then resume -----------------------------------------------------

def _own_run_in_flight(out: Path, since: float) -> bool:
    for d in folders(out):
        for x in in_flight(d):
            try:
                if x.stat().st_mtime >= since:
                    return True
            except FileNotFoundError:  # committed meanwhile
                pass
    return False


def test_random_kills_then_resume_keep_every_finished_run(tmp_path, monkeypatch):
    """At most 5 kills in at most 90 s, each at a random point (seeded) once the runner has started its
    runs: in an engine run, committing one, between two; then a resume finishes the campaign."""
    rng = random.Random(14)
    p = campaign(tmp_path, repeats=2, sleep_ms=40, tokens=6)
    out = tmp_path / "bd"
    tmp = tmp_path / "tmp"  # the runners' TMPDIR: every bmoe-run-* there is theirs
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    killed: list[int] = []
    seen: dict[str, dict] = {}
    t_end = time.monotonic() + 90
    while len(killed) < 5 and time.monotonic() < t_end:
        t0 = time.time()
        a = start("run", p, "--out", out)
        wait_for(lambda a=a, t0=t0: a.poll() is not None or _own_run_in_flight(out, t0), timeout=120)
        time.sleep(rng.uniform(0.0, 1.5))
        if a.poll() is not None:
            a.communicate()
            break
        sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
        a.send_signal(sig)
        _, err = a.communicate(timeout=60)
        killed.append(a.pid)
        if sig == signal.SIGTERM and a.returncode == 130:
            assert f"--out {out}" in error_line(err)
        for d in folders(out):  # what was finished stays finished, with the same record
            for rid, rec in manifest_runs(d).items():
                if rec["status"] != "pending":
                    assert seen.setdefault(rid, rec) == rec
    # a kill that lands after the last run committed (the runner finishing its report) leaves a complete
    # folder: running again would start a second campaign, so resume only an unfinished one
    fs = folders(out)
    if not (len(fs) == 1 and json.loads((fs[0] / "manifest.json").read_text())["status"] == "complete"):
        r = bench("run", p, "--out", out)
        assert r.returncode == 0, r.stderr
    else:  # the kill may have cut its report short: the report command writes it from the raw files
        assert cli("report", fs[0]).returncode == 0
    (folder,) = folders(out)
    runs = manifest_runs(folder)
    assert all(x["status"] == "ok" for x in runs.values())
    assert all(runs[k] == v for k, v in seen.items())
    check_ok(folder)
    assert killed and list(tmp.iterdir()) == []  # no temporary directory of any killed runner left
