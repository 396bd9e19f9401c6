"""Replication (campaign key `replicate:`, issue 35 item 3) on a real adbd device with a device profile
(tests/adbd/README.md): the same phone replicates its ratio over three tries while nothing changes, and does not when
it throttles after the first try. The engine is a POSIX sh script whose cell `--scaled 1` takes longer per token
as policy7's scaling_max_freq falls below cpuinfo_max_freq (as a CPU-bound decode would), so a cap the test puts on
the phone between tries halves that cell's tok/s from then on, and the base cell's stays. Run by
tests/adbd/run-adb-tests.sh; skipped elsewhere."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import pytest

from harness.formats.manifest import load_manifest
from harness.report.checker import check_folder
from tests.helpers.runner import BENCH, wait_for
from tests.helpers.sh_engine import adb_campaign, sh_engine

pytestmark = [pytest.mark.adb]

# writes a bmoe_metrics v2 CSV where --csv says: 6 tokens of 100 ms, or with --scaled 1 of
# 100 ms x cpuinfo_max_freq / scaling_max_freq of policy7 (200 ms when the phone caps it at half)
_SCALED = r"""ms=100
if [ "$scaled" != 0 ]; then
  d=/sys/devices/system/cpu/cpufreq/policy7
  ms=$(( 100 * $(cat $d/cpuinfo_max_freq) / $(cat $d/scaling_max_freq) ))
fi
"""
ENGINE = sh_engine('n=6; scaled=0; csv=""; m=""', ('--scaled) scaled="$2"; shift 2;;',), _SCALED)


def _campaign(tmp_path: Path, serial: str, wait_s: int) -> Path:
    return adb_campaign(tmp_path, ENGINE, name="rep", serial=serial, file="rep.yaml", keys=f"""\
        repeats: 2
        tokens: 6
        warmup_tokens: 1
        timeout_s: 120
        axes:
          - {{flag: --scaled, values: [1]}}
        replicate: {{tries: 3, within_pct: 5, wait_s: {wait_s}}}
        """)


def _run(p: Path, out: Path) -> tuple[subprocess.CompletedProcess, Path]:
    r = subprocess.run([*BENCH, "run", str(p), "--out", str(out)], capture_output=True, text=True, timeout=900)
    return r, next(out.glob("*-rep"))


def test_a_steady_phone_replicates_its_ratio_over_three_tries(tmp_path, phone):
    before = phone.profile.snapshot()
    r, folder = _run(_campaign(tmp_path, phone.serial, wait_s=1), tmp_path / "bd")
    assert r.returncode == 0, r.stderr
    m = load_manifest(folder)
    assert m.status == "complete" and sorted({x.try_index for x in m.runs}) == [0, 1, 2]
    checked = check_folder(folder)
    assert any(n.startswith("replicate: replicated within 5% over 3 tries (widest spread 0.00%") for n in checked.notes)
    assert not [x for x in checked.problems if x.startswith("replicate")]
    assert "**Replication**: Replicated within 5% over 3 tries" in (folder / "findings.md").read_text()
    assert phone.profile.snapshot() == before


def test_a_phone_that_throttles_after_the_first_try_does_not_replicate(tmp_path, phone):
    cap = phone.profile.freq(7)["cpuinfo_max"] // 2
    out = tmp_path / "bd"
    p = _campaign(tmp_path, phone.serial, wait_s=6)

    def first_try_done() -> bool:
        try:
            m = json.loads(next(out.glob("*-rep/manifest.json")).read_text())
        except (StopIteration, FileNotFoundError, json.JSONDecodeError):
            return False
        first = [x for x in m["runs"] if x.get("try_index") == 0]
        return bool(first) and all(x["status"] != "pending" for x in first)

    def throttle_between_tries() -> None:  # in the wait before try 2: the phone caps policy7 at half, and stays so
        wait_for(first_try_done, timeout=600)
        phone.profile.throttle(7, cap)

    t = threading.Thread(target=throttle_between_tries, daemon=True)
    t.start()
    r, folder = _run(p, out)
    t.join(10)
    assert r.returncode == 0, r.stderr
    m = load_manifest(folder)
    first_end = max(x.end for x in m.runs if x.try_index == 0)
    assert min(x.start for x in m.runs if x.try_index == 1) > first_end  # the tries did not overlap
    checked = check_folder(folder)
    line = next(x for x in checked.problems if x.startswith("replicate"))
    # try 1: 1.00x; tries 2 and 3: 0.50x (200 ms a token against 100): spread max/min - 1 = 100%, 95 pp over 5%
    assert line.startswith("replicate: not replicated by 95.00 pp") and "spread 100.00%" in line, line
    r = subprocess.run([*BENCH, "check", str(folder)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and line in r.stderr
    assert "NOT within 5%: missed by 95.00 pp" in (folder / "findings.md").read_text()
