"""`bmoe-bench check` holds each streamed run's `odirect_effective` (the engine's word, in its metrics CSV) against the
storage probe of the device it ran on (provenance): on a copy of the committed four-device loopback campaign, whose
12 streamed runs asked for O_DIRECT and got it, given each device's storage as a campaign records it now."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.report.check_devices import fingerprint_of
from harness.report.check_odirect import check_odirect
from harness.report.checker import check_folder
from harness.report.collect import load_campaign_data

FLEET = Path(__file__).resolve().parents[2] / "bench-data" / "2026-12-03-fleet-loopback"
PROBED = {"yes": "a 4 KiB read of the model with `dd iflag=direct` succeeded",
          "no": "`dd iflag=direct` on the model was refused: dd: Invalid argument",
          "unknown": "no dd on the device"}


def storage(o_direct: str) -> dict:
    return {"path": "/data/local/tmp/bmoe", "kind": "ufs", "fs": "f2fs", "mount_point": "/data",
            "o_direct": o_direct, "o_direct_how": PROBED[o_direct]}


@pytest.fixture
def folder(tmp_path) -> Path:
    d = tmp_path / FLEET.name
    shutil.copytree(FLEET, d)
    return d


def record(folder: Path, probed: dict[str, str]) -> None:
    """Each device's fingerprint and storage in provenance.devices, its probe's O_DIRECT as given (default yes)."""
    p = folder / "manifest.json"
    m = json.loads(p.read_text())
    m["provenance"]["devices"] = {
        label: {"fingerprint": fingerprint_of(desc).model_dump(mode="json", exclude_none=True),
                "storage": storage(probed.get(label, "yes"))}
        for label, desc in m["devices"].items()}
    p.write_text(json.dumps(m, indent=1))


def streamed(folder: Path, device: str) -> list[str]:
    data = load_campaign_data(folder)
    return [r.run_id for r in data.runs if r.rec.device == device and r.metrics is not None
            and r.metrics.meta.get("odirect_effective") == "1"]


def test_agreeing_records_pass(folder):
    record(folder, {})
    res = check_folder(folder)
    assert res.ok, res.problems
    assert check_odirect(load_campaign_data(folder)) == ([], [])
    assert len(streamed(folder, "lo-b1")) == 3  # what the rest relies on: each device has streamed runs


def test_the_engine_claiming_o_direct_where_the_probe_found_it_refused_is_a_problem(folder):
    record(folder, {"lo-b1": "no"})
    found = [p for p in check_folder(folder).problems if "O_DIRECT" in p]
    want = streamed(folder, "lo-b1")
    assert len(found) == len(want) == 3
    for rid, line in zip(want, found, strict=True):
        assert line.startswith(f"run {rid}: the engine says O_DIRECT took effect") and "device lo-b1" in line
        assert "one of the two is wrong" in line


def test_a_run_read_buffered_where_o_direct_works_is_a_problem_where_it_is_refused_a_note(folder):
    record(folder, {"lo-a2": "unknown"})
    data = load_campaign_data(folder)
    one, other = streamed(folder, "lo-a1")[0], streamed(folder, "lo-a2")[0]
    for r in data.runs:  # the engine's word for two runs as a fallback to buffered reads would write it
        if r.run_id in (one, other):
            r.metrics.meta["odirect_effective"] = "0"
    problems, notes = check_odirect(data)
    assert problems == [f"run {one}: it asked for O_DIRECT and the engine read buffered, though the storage probe "
                        f"found O_DIRECT works on device lo-a1: its cell measured buffered reads"]
    assert notes == [f"run(s) {other} asked for O_DIRECT and the engine read buffered (through the page cache) on "
                     f"device lo-a2 (storage probe: O_DIRECT unknown)"]


def test_a_folder_without_storage_records_is_not_judged(folder):
    assert check_odirect(load_campaign_data(folder)) == ([], [])
