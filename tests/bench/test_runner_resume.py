"""Resumability: after Ctrl-C (or SIGTERM) nothing finished is repeated and nothing is lost; a run
committed but missing from the manifest is adopted; a resume with another engine is refused."""

import signal
import subprocess
import time

import pytest

from harness.campaigns.runner import run_campaign
from harness.errors import UserError
from harness.formats.manifest import RunRecord, load_manifest, raw_file_changes, save_manifest
from tests.helpers.runner import BENCH, campaign, finished, quiet, wait_for


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_and_resume_repeats_nothing_and_loses_nothing(tmp_path, sig):
    p = campaign(tmp_path, repeats=3, sleep_ms=60, tokens=6)  # ~0.4 s per run, 6 runs
    root = tmp_path / "bd"
    proc = subprocess.Popen([*BENCH, "run", str(p), "--out", str(root), "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = wait_for(lambda: next(iter(root.glob("*-t")), None) if root.is_dir() else None)
    wait_for(lambda: len(finished(folder)) >= 2)
    time.sleep(0.15)  # land inside a run
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    m1 = load_manifest(folder)
    done1 = {r.run_id: r.start for r in m1.runs if r.finished}
    assert 2 <= len(done1) < 6 and m1.status == "interrupted"
    assert not list((folder / "runs").glob(".*")), "a half-written run was left behind"
    assert sorted(d.name for d in (folder / "runs").iterdir()) == sorted(done1)
    # no engine left running
    assert subprocess.run(["pgrep", "-f", str(tmp_path / "fake-engine")], capture_output=True).returncode == 1

    r = subprocess.run([*BENCH, "run", str(p), "--out", str(root), "--no-report"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"resuming {folder}" in r.stderr.replace("\n", "")
    assert f"{6 - len(done1)} runs ok" not in r.stdout  # the summary counts all of them
    assert "6 runs ok, 0 failed, " + f"{len(done1)} finished earlier" in r.stdout
    m2 = load_manifest(folder)
    assert m2.status == "complete" and len(m2.sessions) == 2 and all(s.end for s in m2.sessions)
    assert all(x.status == "ok" for x in m2.runs)
    for rid, start in done1.items():  # finished runs kept as they were, not run again
        assert next(x for x in m2.runs if x.run_id == rid).start == start
    assert len({x.run_id for x in m2.runs}) == 6
    assert sorted(d.name for d in (folder / "runs").iterdir()) == sorted(x.run_id for x in m2.runs)
    assert len(list(root.iterdir())) == 1  # resumed in place, no second folder
    assert raw_file_changes(folder, m2) == []


def test_a_run_committed_but_missing_from_the_manifest_is_adopted(tmp_path):
    p = campaign(tmp_path, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = load_manifest(res.folder)
    done = m.runs[1]
    # as if killed between renaming the run folder into place and rewriting the manifest
    m.runs[1] = RunRecord(**done.slot(), status="pending")
    m.status = "running"
    save_manifest(res.folder, m)
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert res2.folder == res.folder and res2.n_skipped == 2
    adopted = load_manifest(res.folder).runs[1]
    assert adopted == done  # its outcome.json and file hashes taken back as they were


def test_resume_refuses_a_different_engine(tmp_path):
    p = campaign(tmp_path, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = load_manifest(res.folder)
    m.runs[1] = RunRecord(**m.runs[1].slot(), status="pending")
    m.status = "interrupted"
    save_manifest(res.folder, m)
    exe = tmp_path / "fake-engine"
    exe.write_text(exe.read_text().replace('print("fake-engine 1.0")', 'print("fake-engine 2.0")'))
    with pytest.raises(UserError, match=r"the engine changed since this campaign started \('fake-engine 1.0' -> "
                                        r"'fake-engine 2.0'\)"):
        run_campaign(p, root=tmp_path / "bd", console=quiet())
