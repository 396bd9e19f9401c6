"""The harness measured on itself (issue 24 item 7): the manifest written as runs finish at most 5% of the time
(a write held back is written at the end, and a run finished meanwhile is never lost: its folder is committed),
and the scheduler benchmark on simulated devices."""

from __future__ import annotations

import json

from harness.campaigns.fleet.bench_sched import main, measure
from harness.campaigns.store import ManifestSaver
from harness.formats.manifest import load_manifest
from tests.helpers.folders import manifest


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        self.t += 0.001  # every reading of the clock: a write takes 1 ms, as far as the saver can tell
        return self.t


def test_the_manifest_is_held_back_at_most_a_twentieth_of_the_time(tmp_path):
    clock = Clock()
    saver = ManifestSaver(tmp_path, clock=clock)
    m = manifest(status="running")
    assert saver.save(m) and load_manifest(tmp_path).status == "running"
    m.status = "complete"
    assert not saver.save(m) and saver.held  # 1 ms of writing: the next one 20 ms later
    assert load_manifest(tmp_path).status == "running"
    clock.t += 0.02
    assert saver.save(m) and not saver.held and load_manifest(tmp_path).status == "complete"
    m.status = "interrupted"
    assert not saver.save(m)
    saver.flush(m)
    assert load_manifest(tmp_path).status == "interrupted" and saver.writes == 3
    saver.flush(m)
    assert saver.writes == 3  # nothing held back: nothing written


def test_the_scheduler_benchmark_runs_a_campaign_on_simulated_devices(tmp_path, capsys):
    row = measure(1, 40, 0.0, sequential=True)
    assert row["runs"] == row["ok"] == 40 and row["devices"] == 1 and row["runner"] == "sequential"
    assert row["run_phase_s"] <= row["wall_s"] and row["overhead_ms_per_run"] > 0 and row["cpu_ms_per_run"] > 0
    assert row["manifest_bytes"] > 40 * 500 and row["manifest_load_s"] > 0
    out = tmp_path / "r.jsonl"
    assert main(["--devices", "4", "--runs", "40", "--run-s", "0.05", "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row == json.loads(capsys.readouterr().out) and row["runner"] == "fleet"
    assert row["runs"] == row["ok"] == 40 and row["run_phase_s"] < 40 * 0.05  # four devices at once
