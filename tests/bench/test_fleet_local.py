"""A fleet campaign's whole path (plan over the devices, folder, every device opened and staged at once, the
scheduler, one writer, the manifest's fleet records) with this machine's LocalTarget standing in for each
device (`run_campaign(..., fleet_target=...)`, as the scheduler benchmark drives it) and a real engine
process per run (tests/fixtures/fake_engine.py). Over real adbd devices: tests/bench/test_fleet_adb.py."""

from __future__ import annotations

import textwrap
from datetime import datetime

from harness.campaigns.runner import run_campaign
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.targets.local import LocalTarget
from tests.helpers.runner import engine, quiet


def _campaign(tmp_path, use: str, repeats: int):
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / f"{use}.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: local-{use}
        model: {{push_from: {model}}}
        engine: {{kind: external, push_from: {exe}}}
        flags: {{--speed: 10, --sleep-ms: 60}}
        repeats: {repeats}
        tokens: 6
        warmup_tokens: 1
        cooldown: {{max_wait_s: 5}}
        timeout_s: 60
        axes:
          - {{flag: --speed, values: [20]}}
        targets:
          - {{serial: one, label: d1}}
          - {{serial: two, label: d2}}
          - {{serial: three, label: d3}}
        fleet: {{use: {use}}}
        """))
    return p


def _at_once(runs) -> int:
    t = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()  # noqa: E731
    marks = sorted([(t(r.start), 1) for r in runs] + [(t(r.end), -1) for r in runs], key=lambda x: (x[0], x[1]))
    now = best = 0
    for _, d in marks:
        now += d
        best = max(best, now)
    return best


def test_compare_fleet_records_each_device_and_runs_them_at_once(tmp_path):
    made = []

    def target(d):
        made.append(d.label)
        return LocalTarget()

    res = run_campaign(_campaign(tmp_path, "compare", 2), root=tmp_path / "bd", console=quiet(), fleet_target=target)
    assert sorted(made) == ["d1", "d2", "d3"] and (res.n_ok, res.n_failed, res.n_not_run) == (12, 0, 0)
    m = load_manifest(res.folder)
    assert m.status == "complete" and m.campaign.fleet.use == "compare"
    assert m.campaign.fleet.devices == ["d1", "d2", "d3"] and sorted(m.devices) == ["d1", "d2", "d3"]
    assert [(c.device, c.varied) for c in m.campaign.cells] == [
        ("d1", {}), ("d1", {"--speed": 20}), ("d2", {"device": "d2"}), ("d2", {"--speed": 20, "device": "d2"}),
        ("d3", {"device": "d3"}), ("d3", {"--speed": 20, "device": "d3"})]
    by = {c.index: c.device for c in m.campaign.cells}
    assert all(r.status == "ok" and r.device == by[r.cell] for r in m.runs)
    assert _at_once(m.runs) >= 2  # one worker per device
    assert raw_file_changes(res.folder, m) == []


def test_spread_fleet_shares_the_runs_and_each_records_its_device(tmp_path):
    res = run_campaign(_campaign(tmp_path, "spread", 6), root=tmp_path / "bd", console=quiet(),
                       fleet_target=lambda d: LocalTarget())
    assert (res.n_ok, res.n_not_run) == (12, 0)
    m = load_manifest(res.folder)
    assert [c.label for c in m.campaign.cells] == ["base", "--speed=20"]
    assert all(c.device is None for c in m.campaign.cells)
    used = {r.device for r in m.runs}
    assert used <= {"d1", "d2", "d3"} and len(used) >= 2
    assert m.devices["d1"]["kind"] == "local"


def test_a_second_runner_of_the_same_fleet_folder_is_refused(tmp_path):
    import threading

    import pytest

    from harness.campaigns.store import FolderBusy
    from tests.helpers.runner import wait_for

    p = _campaign(tmp_path, "compare", 2)
    p.write_text(p.read_text().replace("--sleep-ms: 60", "--sleep-ms: 300"))
    root = tmp_path / "bd"
    first: dict = {}
    t = threading.Thread(target=lambda: first.update(res=run_campaign(p, root=root, console=quiet(),
                                                                      fleet_target=lambda d: LocalTarget())))
    t.start()
    try:
        wait_for(lambda: list(root.glob("*-local-compare/runs/r01-*")))  # running: a run committed
        with pytest.raises(FolderBusy, match="in use by another bmoe-bench run"):
            run_campaign(p, root=root, console=quiet(), fleet_target=lambda d: LocalTarget())
    finally:
        t.join()
    assert first["res"].n_ok == 12
