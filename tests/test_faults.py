"""Fault injection on the campaign harness, one test per fault, each with real parts: real `bmoe-bench run`
processes (tests/fixtures/fake_engine.py as the engine), a real 3 MiB tmpfs filled up at each write stage,
real kill -9 and SIGTERM, raw files and manifests truncated or corrupted on disk. The invariant after any
of them: one line naming what went wrong and what to do, no hang, and after a resume every finished run
intact and `report --check` passing. The engine's own faults (a model truncated under it): test_faults_engine.py."""

from __future__ import annotations

import errno
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runner_helpers import BENCH, campaign, finished, wait_for

# ---- helpers ---------------------------------------------------------------------------------------------------


def bench(*args: object, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_env())


def cli(*args: object) -> subprocess.CompletedProcess:
    """`bmoe-bench ARGS` in this process (report, validate: no interpreter start per call), as a process result."""
    import contextlib
    import io

    from harness.bench_cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())


def start(*args: object) -> subprocess.Popen:
    return subprocess.Popen([*BENCH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env())


def _env() -> dict[str, str]:
    return dict(os.environ)


def error_line(stderr: str) -> str:
    """The one `Error:` line of a bmoe-bench run, and no traceback."""
    assert "Traceback" not in stderr, stderr
    errs = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert len(errs) == 1, stderr
    return errs[0]


def held(tmp_path: Path, **kw) -> tuple[Path, Path]:
    """The runner_helpers campaign whose engine waits after its first token until the gate file exists."""
    p = campaign(tmp_path, **kw)
    gate = tmp_path / "go"
    p.write_text(p.read_text().replace("--sleep-ms: ", f"--hold: {gate}, --sleep-ms: ", 1)
                 .replace("timeout_s: 60", "timeout_s: 600"))
    return p, gate


def in_flight(folder: Path) -> list[Path]:
    return list((folder / "runs").glob(".*.tmp"))


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "gone"


def folders(out: Path) -> list[Path]:
    return sorted(d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")) if out.is_dir() else []


def check_ok(folder: Path) -> None:
    r = cli("report", folder, "--check")
    assert r.returncode == 0, r.stderr


def manifest_runs(folder: Path) -> dict[str, dict]:
    return {r["run_id"]: r for r in json.loads((folder / "manifest.json").read_text())["runs"]}


@pytest.fixture
def tmpfs(tmp_path):
    """A real 3 MiB tmpfs (needs root; skipped elsewhere)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def fill(d: Path, leave: int = 0) -> Path:
    """Fill the filesystem holding d, leaving about `leave` bytes."""
    f = d / "filler"
    with open(f, "ab", buffering=0) as fh:
        n = shutil.disk_usage(d).free - leave
        try:
            while n > 0:
                fh.write(b"\0" * min(n, 1 << 20))
                fh.flush()
                n -= 1 << 20
            if leave == 0:
                while True:
                    fh.write(b"\0" * 4096)
                    fh.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC
    return f


@pytest.fixture(scope="module")
def done_folder(tmp_path_factory) -> Path:
    """A finished campaign (2 cells x 2 repeats, report written), to copy and break."""
    tmp = tmp_path_factory.mktemp("done")
    p = campaign(tmp, repeats=2)
    r = bench("run", p, "--out", tmp / "bd")
    assert r.returncode == 0, r.stderr
    (folder,) = folders(tmp / "bd")
    return folder


@pytest.fixture
def copy(done_folder, tmp_path) -> Path:
    dest = tmp_path / "bd" / done_folder.name
    shutil.copytree(done_folder, dest)
    return dest


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


# ---- 2. disk full at every write stage --------------------------------------------------------------------------

def test_disk_full_while_the_engine_runs_is_one_line_then_resumable(tmp_path, tmpfs):
    p, gate = held(tmp_path, repeats=2, tokens=8)
    out = tmpfs / "bd"
    a = start("run", p, "--out", out)
    folder = wait_for(lambda: (folders(out) or [None])[0], timeout=120)
    wait_for(lambda: in_flight(folder), timeout=120)
    gate.touch()
    wait_for(lambda: finished(folder), timeout=120)
    gate.unlink()
    wait_for(lambda: in_flight(folder), timeout=120)  # the second run, waiting after its first token
    kept = {k: v["start"] for k, v in manifest_runs(folder).items() if v["status"] != "pending"}
    filler = fill(tmpfs)
    gate.touch()  # it goes on: 7 more progress lines to a log on a full disk
    t0 = time.monotonic()
    _, err = a.communicate(timeout=120)
    assert time.monotonic() - t0 < 60  # no hang until the campaign timeout
    assert a.returncode == 28, err
    line = error_line(err)
    assert "disk full" in line and str(tmpfs) in line and f"--out {out}" in line, line
    filler.unlink()
    r = bench("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    assert folders(out) == [folder]
    runs = manifest_runs(folder)
    assert all(r["status"] == "ok" for r in runs.values())
    assert all(runs[k]["start"] == s for k, s in kept.items())  # nothing finished lost or redone
    check_ok(folder)


def test_an_engine_failing_on_a_full_disk_stops_the_campaign_resumable(tmp_path, tmpfs, monkeypatch):
    """The engine's own CSV (under TMPDIR, full) cannot be written: a full disk, not a failed run."""
    import tempfile

    p = campaign(tmp_path, repeats=1, tokens=300)  # a CSV of ~40 KiB
    out = tmp_path / "bd"
    monkeypatch.setenv("TMPDIR", str(tmpfs))
    monkeypatch.setattr(tempfile, "tempdir", None)
    filler = fill(tmpfs, leave=8192)  # room for tempfile's probe, not for the CSV
    r = cli("run", p, "--out", out)
    assert r.returncode == 28, r.stderr
    line = error_line(r.stderr)
    assert f"{tmpfs}" in line and "disk full" in line, line
    (folder,) = folders(out)
    assert all(x["status"] == "pending" for x in manifest_runs(folder).values())  # no run recorded as failed
    filler.unlink()
    r = cli("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    check_ok(folder)


def test_disk_full_in_the_engine_log_never_blocks_the_engine(tmp_path, tmpfs):
    """The engine writes 4 MiB to stdout after the disk is full: the pipe is still drained."""
    from harness.formats.files import DiskFull
    from harness.targets.local import LocalTarget

    fill(tmpfs)
    argv = [sys.executable, "-c", "import sys\nfor i in range(4096): sys.stdout.write('x' * 1023 + '\\n')"]
    t0 = time.monotonic()
    with pytest.raises(DiskFull, match="engine.log: disk full"):
        LocalTarget().run(argv, timeout_s=60, outputs=[], out_dir=tmp_path, log_path=tmpfs / "engine.log")
    assert time.monotonic() - t0 < 20


def test_disk_full_fetching_the_engine_csv(tmp_path, tmpfs):
    from harness.formats.files import DiskFull
    from harness.targets.local import LocalTarget

    csv = tmp_path / "r.csv"
    argv = [sys.executable, "-c", f"open({str(csv)!r}, 'w').write('x' * 200000)"]
    fill(tmpfs, leave=8192)
    with pytest.raises(DiskFull, match=r"r\.csv: disk full \(needs 0\.2 MiB"):
        LocalTarget().run(argv, timeout_s=60, outputs=[str(csv)], out_dir=tmpfs, log_path=tmp_path / "log")
    assert not (tmpfs / "r.csv").exists()  # no partial copy


def test_disk_full_committing_a_run_and_the_manifest(copy, tmp_path, tmpfs):
    from harness.campaigns import store
    from harness.formats.files import DiskFull
    from harness.formats.manifest import load_manifest, save_manifest
    from harness.formats.outcome import read_outcome

    folder = tmpfs / copy.name
    shutil.copytree(copy, folder)
    m = load_manifest(folder)
    before = (folder / "manifest.json").read_bytes()
    o = read_outcome(folder / "runs" / "r01-c00" / "outcome.json")
    tmp = store.tmp_run_dir(folder, "r01-c00")
    tmp.mkdir()
    fill(tmpfs)
    with pytest.raises(DiskFull, match="outcome.json: disk full"):
        store.commit_run(folder, "r01-c00", o)
    m.status = "running"
    with pytest.raises(DiskFull, match="manifest.json: disk full"):
        save_manifest(folder, m)
    assert (folder / "manifest.json").read_bytes() == before  # the old one, whole
    assert (folder / "runs" / "r01-c00" / "outcome.json").is_file()  # the committed run untouched
    assert store.clear_tmp(folder) == [tmp.name]  # only the half-written run, no stray temp file


def test_disk_full_when_starting_a_campaign_leaves_no_half_folder(tmp_path, tmpfs):
    p = campaign(tmp_path, repeats=1)
    out = tmpfs / "bd"
    out.mkdir()
    filler = fill(tmpfs)
    r = cli("run", p, "--out", out)
    assert r.returncode == 28, r.stderr
    assert "disk full" in error_line(r.stderr)
    assert [d.name for d in out.iterdir()] == []
    filler.unlink()
    r = cli("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    check_ok(folders(out)[0])


def test_disk_full_writing_the_report_and_check_sees_missing_plots(copy, tmpfs):
    folder = tmpfs / copy.name
    shutil.copytree(copy, folder)
    shutil.rmtree(folder / "plots")
    filler = fill(tmpfs, leave=24 * 1024)  # findings.md and results.csv fit, the plots do not
    r = cli("report", folder)
    assert r.returncode == 28
    assert "disk full" in error_line(r.stderr)
    leftovers = [p.name for p in folder.rglob(".*") if p.name.endswith(".tmp")]
    assert leftovers == []
    r = cli("report", folder, "--check")
    assert r.returncode == 2 and "plots/" in error_line(r.stderr)
    filler.unlink()
    assert cli("report", folder).returncode == 0
    check_ok(folder)


def test_report_check_flags_a_stray_temp_file_and_a_cut_plot(copy):
    (copy / "plots" / ".split.png.tmp").write_bytes(b"\x89PNG")
    png = copy / "plots" / "tokens.png"
    png.write_bytes(png.read_bytes()[:1000])
    r = cli("report", copy, "--check")
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert "plots/.split.png.tmp" in line and "plots/tokens.png" in line, line


# ---- 3. raw files and manifests validated when read --------------------------------------------------------------

def _cut_half(t: str) -> str:
    return t[: len(t) // 2]


def _drop_rows(t: str) -> str:
    lines = t.splitlines(keepends=True)
    body = [i for i, x in enumerate(lines) if not x.startswith("#")]
    return "".join(lines[: body[-2]] + [x for x in lines[body[-1] + 1:]])


CSV_FAULTS = {
    "truncated-mid-row": _cut_half,
    "rows-missing": _drop_rows,
    "no-summary": lambda t: "".join(x for x in t.splitlines(keepends=True) if not x.startswith("# summary")),
    "wall-corrupted": lambda t: _corrupt_wall(t),
    "column-renamed": lambda t: t.replace(",wall_ms,", ",wall,", 1),
}


def _corrupt_wall(t: str) -> str:
    lines = t.splitlines(keepends=True)
    i = [j for j, x in enumerate(lines) if x[:1].isdigit()][2]
    f = lines[i].split(",")
    f[2] = "garbage"
    lines[i] = ",".join(f)
    return "".join(lines)


@pytest.mark.parametrize("fault", list(CSV_FAULTS))
def test_a_broken_metrics_csv_marks_its_run_invalid(copy, fault):
    csv = copy / "runs" / "r01-c00" / "metrics.csv"
    csv.write_text(CSV_FAULTS[fault](csv.read_text()))
    r = cli("report", copy)
    assert r.returncode == 0, r.stderr
    md = (copy / "findings.md").read_text()
    warn = [x for x in md.splitlines() if x.startswith("- invalid:")]
    assert len(warn) == 1 and "r01-c00: runs/r01-c00/metrics.csv: " in warn[0] and str(copy) not in warn[0], md
    results = (copy / "results.csv").read_text().splitlines()
    cols = results[0].split(",")
    base = dict(zip(cols, results[1].split(","), strict=True))
    assert base["runs_ok"] == "1" and base["runs_failed"] == "1"
    r = cli("report", copy, "--check")
    assert r.returncode == 2 and "runs/r01-c00/metrics.csv" in error_line(r.stderr)


MANIFEST_FAULTS = {
    "cut-json": lambda t: t[: len(t) // 2],
    "no-runs": lambda t: json.dumps({k: v for k, v in json.loads(t).items() if k != "runs"}),
    "runs-wrong-type": lambda t: json.dumps({**json.loads(t), "runs": "all of them"}),
    "status-wrong-type": lambda t: json.dumps({**json.loads(t), "status": 3}),
}


@pytest.mark.parametrize("fault", list(MANIFEST_FAULTS))
def test_a_malformed_manifest_is_one_line_from_report(copy, fault):
    p = copy / "manifest.json"
    p.write_text(MANIFEST_FAULTS[fault](p.read_text()))
    for extra in ((), ("--check",)):
        r = cli("report", copy, *extra)
        assert r.returncode == 2
        assert str(p) in error_line(r.stderr)


def test_run_never_abandons_an_unfinished_folder_with_a_cut_manifest(tmp_path):
    p = campaign(tmp_path, repeats=2)
    out = tmp_path / "bd"
    r = cli("run", p, "--out", out, "--set", "tokens=6")
    (folder,) = folders(out)
    m = folder / "manifest.json"
    obj = json.loads(m.read_text())
    obj["status"] = "interrupted"
    m.write_text(json.dumps(obj)[:3000])
    r = cli("run", p, "--out", out, "--set", "tokens=6")
    assert r.returncode == 2
    line = error_line(r.stderr)
    assert str(m) in line and "not valid JSON" in line and "--fresh" in line, line
    assert folders(out) == [folder]  # no -2 folder, no runs redone


# ---- 5. true messages -------------------------------------------------------------------------------------------

def test_the_resume_hint_after_sigterm_is_the_whole_command_and_it_resumes(tmp_path):
    p = campaign(tmp_path, repeats=2, sleep_ms=150)
    out = tmp_path / "bd"
    a = start("run", p, "--out", out, "--set", "tokens=6")
    folder = wait_for(lambda: (folders(out) or [None])[0])
    wait_for(lambda: finished(folder))
    a.send_signal(signal.SIGTERM)
    _, err = a.communicate(timeout=60)
    assert a.returncode == 130
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
    from test_report import TWO, csv_text, make_folder

    from harness.report.build import build_report

    runs = [(c, 0, csv_text([999, 100 / (c + 1), 100, 100], preamble={"cfg.fast": str(bool(c)),
                                                                     "cfg.csv": f"/tmp/bmoe-run-{c}/r.csv"}))
            for c in (0, 1)]
    folder = make_folder(tmp_path, TWO, runs, repeats=1)
    header = build_report(folder, with_plots=False).texts["results.csv"].splitlines()[0].split(",")
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
    r = bench("run", p, "--out", out)
    assert r.returncode == 0, r.stderr
    (folder,) = folders(out)
    runs = manifest_runs(folder)
    assert all(x["status"] == "ok" for x in runs.values())
    assert all(runs[k] == v for k, v in seen.items())
    check_ok(folder)
    assert killed and list(tmp.iterdir()) == []  # no temporary directory of any killed runner left

