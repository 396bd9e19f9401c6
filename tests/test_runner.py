"""The campaign runner end to end on this machine, with a small external engine (tests/fixtures/
fake_engine.py: a real process writing a real bmoe_metrics v2 CSV and BMOE_PROGRESS lines): run layout,
failed runs, resumability after Ctrl-C (the cooldown gate, the state sampler and the progress ETA
are in test_campaign_timing.py)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from harness.campaigns import store
from harness.campaigns.runner import run_campaign
from harness.errors import UserError

FAKE = Path(__file__).parent / "fixtures" / "fake_engine.py"
BENCH = [sys.executable, "-m", "harness.bench_cli"]


def engine(tmp_path: Path) -> Path:
    exe = tmp_path / "fake-engine"
    exe.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    exe.chmod(0o755)
    return exe


def campaign(tmp_path: Path, *, fail_axis: bool = False, repeats: int = 2, sleep_ms: int = 0, tokens: int = 6,
             name: str = "t") -> Path:
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / f"{name}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: {name}
        model: {{path: {model}}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10, --sleep-ms: {sleep_ms}}}
        repeats: {repeats}
        tokens: {tokens}
        warmup_tokens: 1
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes:
          - flag: --speed
            values: [20]
        """) + ("  - {flag: --fail, values: [3]}\n" if fail_axis else ""))
    return p


def quiet() -> Console:
    return Console(file=StringIO(), width=100)


def test_a_campaign_leaves_a_complete_self_describing_folder(tmp_path):
    res = run_campaign(campaign(tmp_path), root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed, res.n_skipped) == (4, 0, 0)
    folder = res.folder
    assert folder.parent == tmp_path / "bd" and folder.name.endswith("-t")
    assert (folder / "campaign.yaml").read_text() == (tmp_path / "t.yaml").read_text()
    m = store.load_manifest(folder)
    assert m["format"] == "bmoe-manifest" and m["version"] == 1 and m["status"] == "complete"
    assert m["engine"]["version"] == "fake-engine 1.0"
    assert m["target"]["kind"] == "local" and m["harness"]["commit"]
    assert [r["run_id"] for r in m["runs"]] == ["r01-c00", "r01-c01", "r02-c01", "r02-c00"]
    starts = [r["start"] for r in m["runs"]]
    assert starts == sorted(starts)
    for r in m["runs"]:
        assert r["status"] == "ok" and r["reason"] is None and r["tokens"] == 6
        d = folder / "runs" / r["run_id"]
        assert sorted(p.name for p in d.iterdir()) == ["engine.log", "metrics.csv", "outcome.json", "state.jsonl"]
        assert (d / "metrics.csv").read_text().startswith("# bmoe_metrics v2\n")
        assert json.loads((d / "outcome.json").read_text())["start"] == r["start"]
        assert "BMOE_PROGRESS" in (d / "engine.log").read_text()
        assert r["entry_state"]["mem_available_mib"] > 0 and r["gate"]["gave_up"] is False
    assert m["runs"][1]["argv"][-4:] == ["--speed", "20", "--sleep-ms", "0"]
    assert not list((folder / "runs").glob(".*"))


def test_failed_run_is_recorded_and_the_rest_continue(tmp_path):
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    r = subprocess.run([*BENCH, "run", str(p), "--out", str(tmp_path / "bd")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert "1 of 3 runs failed" in r.stderr and "--retry-failed" in r.stderr
    (folder,) = (tmp_path / "bd").iterdir()
    m = store.load_manifest(folder)
    by_cell = {x["cell"]: x for x in m["runs"]}
    assert by_cell[2]["status"] == "failed"
    assert by_cell[2]["reason"] == "engine exited 3: fake-engine: failing on purpose with 3"
    assert by_cell[0]["status"] == by_cell[1]["status"] == "ok"
    findings = (folder / "findings.md").read_text()
    assert "failed: engine exited 3" in findings


def _wait_for(pred, timeout=60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out")


def _finished(folder: Path) -> list[dict]:
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [r for r in m["runs"] if r["status"] != "pending"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_and_resume_repeats_nothing_and_loses_nothing(tmp_path, sig):
    p = campaign(tmp_path, repeats=3, sleep_ms=60, tokens=6)  # ~0.4 s per run, 6 runs
    root = tmp_path / "bd"
    proc = subprocess.Popen([*BENCH, "run", str(p), "--out", str(root), "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = _wait_for(lambda: next(iter(root.glob("*-t")), None) if root.is_dir() else None)
    _wait_for(lambda: len(_finished(folder)) >= 2)
    time.sleep(0.15)  # land inside a run
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    m1 = store.load_manifest(folder)
    done1 = {r["run_id"]: r["start"] for r in m1["runs"] if r["status"] != "pending"}
    assert 2 <= len(done1) < 6 and m1["status"] == "interrupted"
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
    m2 = store.load_manifest(folder)
    assert m2["status"] == "complete" and len(m2["sessions"]) == 2
    assert all(x["status"] == "ok" for x in m2["runs"])
    for rid, start in done1.items():  # finished runs kept as they were, not run again
        assert next(x for x in m2["runs"] if x["run_id"] == rid)["start"] == start
    assert len({x["run_id"] for x in m2["runs"]}) == 6
    assert sorted(d.name for d in (folder / "runs").iterdir()) == sorted(x["run_id"] for x in m2["runs"])
    assert len(list(root.iterdir())) == 1  # resumed in place, no second folder


def test_a_run_committed_but_missing_from_the_manifest_is_adopted(tmp_path):
    p = campaign(tmp_path, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = store.load_manifest(res.folder)
    start = m["runs"][1]["start"]
    # as if killed between renaming the run folder into place and rewriting the manifest
    keep = {k: m["runs"][1][k] for k in ("run_id", "round", "cell", "position")}
    m["runs"][1] = {**keep, "status": "pending"}
    m["status"] = "running"
    store.save_manifest(res.folder, m)
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert res2.folder == res.folder and res2.n_skipped == 2
    assert store.load_manifest(res.folder)["runs"][1]["start"] == start


def test_retry_failed_runs_only_the_failed_ones(tmp_path):
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert res.n_failed == 1
    starts = {r["run_id"]: r["start"] for r in store.load_manifest(res.folder)["runs"]}
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet(), retry_failed=True)
    assert res2.folder == res.folder and res2.n_failed == 1  # it fails again, on purpose
    m = store.load_manifest(res.folder)
    failed = next(r for r in m["runs"] if r["status"] == "failed")
    assert len(failed["previous_attempts"]) == 1 and failed["start"] != starts[failed["run_id"]]
    assert all(r["start"] == starts[r["run_id"]] for r in m["runs"] if r["status"] == "ok")


def test_a_changed_campaign_starts_a_new_folder(tmp_path):
    p = campaign(tmp_path, repeats=1)
    a = run_campaign(p, root=tmp_path / "bd", console=quiet())
    p.write_text(p.read_text().replace("tokens: 6", "tokens: 5"))
    b = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert a.folder != b.folder and b.n_skipped == 0


@pytest.mark.skipif(os.geteuid() == 0 and False, reason="")
def test_cli_validate_lists_every_problem(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nmodel: {path: m}\nrepeat: 2\ntokens: many\n")
    r = subprocess.run([*BENCH, "validate", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0] == f"{p}:3: unknown key 'repeat' (did you mean 'repeats'?)"
    assert lines[1].startswith(f"{p}:4: tokens must be an integer")
    assert lines[-1] == f"Error: {p}: 2 problems (listed above)"


def test_resume_refuses_a_different_engine(tmp_path):
    p = campaign(tmp_path, repeats=1)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = store.load_manifest(res.folder)
    m["runs"][1] = {k: m["runs"][1][k] for k in ("run_id", "round", "cell", "position")} | {"status": "pending"}
    m["status"] = "interrupted"
    store.save_manifest(res.folder, m)
    exe = tmp_path / "fake-engine"
    exe.write_text(exe.read_text().replace('print("fake-engine 1.0")', 'print("fake-engine 2.0")'))
    with pytest.raises(UserError, match=r"the engine changed since this campaign started \('fake-engine 1.0' -> "
                                        r"'fake-engine 2.0'\)"):
        run_campaign(p, root=tmp_path / "bd", console=quiet())
