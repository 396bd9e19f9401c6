"""Replication (campaign key `replicate:`): the key and its rules, the plan's tries, and real campaigns on this
machine (the bmoe engine on a generated tiny model): one that replicates (within 1000%: the machinery is what is
gated, the measurement is real), one that does not (within 0.001%), and one interrupted in the wait between two
tries that resumes at the right try, waiting only what was left."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime

import pytest

from harness.campaigns.runner import plan_record, run_campaign
from harness.campaigns.shard import Shard, shard_plan
from harness.campaigns.validate import plan_campaign
from harness.errors import UserError
from harness.formats.manifest import load_manifest
from harness.report.build import check_report, write_report
from harness.report.checker import check_folder
from harness.targets.local import LocalTarget
from tests.helpers.campaign import errors, write
from tests.helpers.runner import BENCH, engine, quiet, wait_for

CAMPAIGN = """\
name: rep
model: {recipe: {shape: tiny}}
flags: {-t: 1}
axes:
  - name: mode
    values:
      mmap: {}
      streamed: {--moe-stream: true}
repeats: 2
tokens: 8
warmup_tokens: 1
cooldown: {mem_available_min_mib: 64, max_wait_s: 5}
"""


def _file(tmp_path, rep: str, extra: str = ""):
    return write(tmp_path, CAMPAIGN + extra + f"replicate: {rep}\n")


@pytest.mark.parametrize("rep, msg", [
    ("{tries: 1}", "replicate.tries must be >= 2, got 1"), ("{tries: 51}", "replicate.tries: Input should be less "
                                                                           "than or equal to 50"),
    ("{within_pct: 0}", "replicate.within_pct: Input should be greater than 0"),
    ("{wait_s: -1}", "replicate.wait_s must be >= 0, got -1"),
    ("{wait_s: 3601}", "replicate.wait_s: Input should be less than or equal to 3600"),
    ("{tries: '5'}", "replicate.tries must be an integer"), ("{retries: 5}", "unknown key 'retries' in replicate"),
])
def test_the_key_is_bounded(tmp_path, rep, msg):
    lines = errors(_file(tmp_path, rep))
    assert any(msg in x for x in lines), lines


def test_replicate_excludes_precision_and_quality(tmp_path):
    lines = errors(_file(tmp_path, "{tries: 3}", "precision: {ratio_half_width: 0.1}\n"))
    assert any("replicate repeats fixed rounds per try; precision adds rounds" in x for x in lines), lines
    q = "quality: {n: 2, template: 'Q: {question}'}\n"
    lines = errors(_file(tmp_path, "{tries: 3}", q))
    assert any("a quality campaign's figure is its grades: remove replicate" in x for x in lines), lines


def test_the_plan_is_tries_of_whole_passes_each_run_naming_its_try(tmp_path):
    plan = plan_campaign(_file(tmp_path, "{tries: 3, within_pct: 5, wait_s: 0}"))
    assert len(plan.runs) == 2 * 2 * 3 and max(r.round for r in plan.runs) == 5
    rec = plan_record(plan)
    assert rec.repeats == 2 and rec.replicate.tries == 3 and rec.replicate.within_pct == 5
    with pytest.raises(UserError, match="replicates .* run it whole"):
        shard_plan(plan, Shard(1, 2))
    plain = plan_record(plan_campaign(write(tmp_path, CAMPAIGN, "plain.yaml")))
    assert "replicate" not in plain.dump()  # a plan without it hashes as before


def test_a_replication_that_passes(tmp_path):
    res = run_campaign(_file(tmp_path, "{tries: 2, within_pct: 1000, wait_s: 1}"), root=tmp_path / "bd",
                       console=quiet())
    m = load_manifest(res.folder)
    assert m.status == "complete" and res.n_ok == 8
    assert [r.try_index for r in m.runs] == [0, 0, 0, 0, 1, 1, 1, 1]
    ends = max(_t(r.end) for r in m.runs if r.try_index == 0)
    assert min(_t(r.start) for r in m.runs if r.try_index == 1) - ends >= 1.0  # wait_s between the tries
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    assert "**Replication**: Replicated within 1000% over 2 tries" in md
    assert "## Replication" in md and "| streamed / mmap | " in md and "| within 1000% |" in md
    assert check_report(res.folder) == []  # findings regenerate from the raw data
    checked = check_folder(res.folder)
    assert any(n.startswith("replicate: replicated within 1000% over 2 tries") for n in checked.notes)
    assert not [p for p in checked.problems if p.startswith("replicate")]


def test_a_replication_that_fails_says_by_how_much(tmp_path):
    res = run_campaign(_file(tmp_path, "{tries: 2, within_pct: 0.001, wait_s: 1}"), root=tmp_path / "bd",
                       console=quiet())
    assert res.n_ok == 8
    checked = check_folder(res.folder)
    line = next(p for p in checked.problems if p.startswith("replicate"))
    assert line.startswith("replicate: not replicated by ") and "against 0.001% asked (streamed / mmap)" in line
    miss = float(line.split("by ")[1].split(" pp")[0])
    spread = float(line.split("spread ")[1].split("%")[0])
    # both printed to 2 decimals, each within 0.005 of its value: 0.01 apart at most (0.006 failed when the spread's
    # third decimal sat at 5, about one run in ten)
    assert miss == pytest.approx(spread - 0.001, abs=0.0101) and spread > 0
    r = subprocess.run([*BENCH, "check", str(res.folder)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and f"{res.folder}: {line}" in r.stderr
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    assert f"NOT within 0.001%: missed by {miss:.2f} pp" in md


def test_interrupted_between_tries_it_resumes_at_the_next_try_waiting_what_is_left(tmp_path):
    p = _file(tmp_path, "{tries: 2, within_pct: 1000, wait_s: 8}")
    root = tmp_path / "bd"
    proc = subprocess.Popen([*BENCH, "run", str(p), "--out", str(root), "--no-report"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    folder = wait_for(lambda: next(iter(root.glob("*-rep")), None) if root.is_dir() else None, timeout=300)
    wait_for(lambda: len(_finished(folder)) >= 4, timeout=300)  # try 1 done: the wait before try 2 has begun
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "replicate: try 2 of 2 starts in" in err
    m1 = load_manifest(folder)
    assert m1.status == "interrupted" and {r.try_index for r in m1.runs if r.finished} == {0}
    assert sum(r.finished for r in m1.runs) == 4
    res = run_campaign(p, root=root, console=quiet())
    m2 = load_manifest(res.folder)
    assert res.folder == folder and m2.status == "complete" and res.n_skipped == 4
    gap = min(_t(r.start) for r in m2.runs if r.try_index == 1) - max(_t(r.end) for r in m2.runs if r.try_index == 0)
    assert gap >= 8.0  # the whole wait, across the interruption: not started again, not skipped


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _finished(folder) -> list[dict]:
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return []
    return [r for r in m["runs"] if r["status"] != "pending"]


def test_a_manifest_whose_run_names_another_try_is_refused(tmp_path):
    res = run_campaign(_file(tmp_path, "{tries: 2, within_pct: 1000, wait_s: 0}"), root=tmp_path / "bd",
                       console=quiet())
    path = res.folder / "manifest.json"
    m = json.loads(path.read_text())
    m["runs"][-1]["try_index"] = 0  # a run of try 2 claiming try 1: the report would compare the wrong runs
    path.write_text(json.dumps(m))
    with pytest.raises(UserError, match="try_index 0 where its round gives 1"):
        load_manifest(res.folder)


def test_a_compare_fleet_replicates_per_device_its_tries_one_after_the_other(tmp_path):
    """The fleet's path (every device at once within a try, a barrier and the wait between tries), with this
    machine's LocalTarget standing in for each device and a real engine process per run (the fake engine: each
    device's ratio is 2.00x in every try, so every device replicates with spread 0)."""
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = write(tmp_path, f"""\
        name: fleet-rep
        model: {{push_from: {model}}}
        engine: {{kind: external, push_from: {exe}}}
        flags: {{--speed: 10, --sleep-ms: 60}}
        repeats: 2
        tokens: 6
        warmup_tokens: 1
        cooldown: {{max_wait_s: 5}}
        timeout_s: 60
        axes:
          - {{flag: --speed, values: [20]}}
        targets:
          - {{serial: one, label: d1}}
          - {{serial: two, label: d2}}
        fleet: {{use: compare}}
        replicate: {{tries: 3, within_pct: 5, wait_s: 1}}
        """)
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(), fleet_target=lambda d: LocalTarget())
    assert (res.n_ok, res.n_not_run) == (24, 0)
    m = load_manifest(res.folder)
    for k in (1, 2):  # no run of a try starts before every run of the one before has ended, and wait_s after it
        gap = min(_t(r.start) for r in m.runs if r.try_index == k) - max(_t(r.end) for r in m.runs
                                                                          if r.try_index == k - 1)
        assert gap >= 1.0
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    for d in ("d1", "d2"):
        assert (f"| {d} | --speed=20 / base | 2.000x [2.000, 2.000] | 2.000x [2.000, 2.000] | 2.000x [2.000, 2.000] "
                f"| 0.00% | 0.00% | within 5% |") in md
    checked = check_folder(res.folder)
    want = "replicate: replicated within 5% over 3 tries (widest spread 0.00%, --speed=20 / base on d1)"
    assert want in checked.notes
