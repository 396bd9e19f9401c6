"""A whole campaign over adb against a real adbd on loopback (tests/adbd/run-adb-tests.sh runs it inside
a private network namespace; anywhere else it skips): engine and model pushed, runs on the "device",
CSVs pulled, a failing cell recorded, the report written from what came back."""

from __future__ import annotations

from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.runner import run_campaign
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.formats.metrics_csv import read_metrics
from harness.report.build import check_report, write_report
from tests.helpers.adbd import SERIAL
from tests.helpers.sh_engine import PROGRESS, adb_campaign, sh_engine

pytestmark = [
    pytest.mark.adb,
]

# a POSIX sh engine: parses the harness's flags, writes a bmoe_metrics v2 CSV where --csv says, prints
# BMOE_PROGRESS lines, ends the CSV with its # summary line;
# --slow doubles the per-token time; --fail exits 3 with one stderr line
ENGINE = sh_engine('n=4; ms=100; csv=""; m=""', (
    '--slow) ms=200; shift;;', '--fail) echo "sh-engine: failing on purpose" >&2; exit 3;;'), after=PROGRESS)


def test_campaign_over_adb(tmp_path):
    p = adb_campaign(tmp_path, ENGINE, name="adbtest", serial=SERIAL, keys="""\
        repeats: 2
        tokens: 4
        cooldown: {cpu_temp_max_c: 90, mem_available_min_mib: 64, max_wait_s: 5}
        timeout_s: 60
        axes:
          - {flag: --slow, values: [true]}
          - {flag: --fail, values: [true]}
        """)
    res = run_campaign(p, root=tmp_path / "bd", console=Console(file=StringIO()))
    assert (res.n_ok, res.n_failed) == (4, 2)
    m = load_manifest(res.folder)
    assert m.target.kind == "adb" and m.target.serial == SERIAL
    assert m.engine.version == "sh-engine 1"  # asked on the device
    for r in m.runs:
        assert r.argv[0].startswith("/data/local/tmp/")  # the engine was staged on the device
        if r.cell == 2:
            assert r.status == "failed" and r.reason == "engine exited 3: sh-engine: failing on purpose"
            continue
        assert r.status == "ok" and r.tokens == 4
        d = res.folder / "runs" / r.run_id
        mt = read_metrics(d / "metrics.csv")
        assert mt.format == "bmoe_metrics v2" and mt.meta["engine_version"] == "sh-engine 1"
        assert "BMOE_PROGRESS" in (d / "engine.log").read_text()
        assert r.entry_state.mem_available_mib > 0
    # nothing written yet: every report file, plots included, is missing
    assert raw_file_changes(res.folder, m) == [] and check_report(res.folder) == [
        "findings.md", "results.csv", "plots/tok_s.png", "plots/split.png", "plots/tokens.png"]
    write_report(res.folder)
    md = (res.folder / "findings.md").read_text()
    # read back from the pulled CSVs' preambles: base 100 ms, --slow=on 200 ms
    assert "Engine facts of **base** (CSV preamble): ms=100." in md
    assert "Engine facts of **--slow=on** (CSV preamble): ms=200." in md
    assert "x base" in md and "0.50 [0.50, 0.50]" in md  # --slow halves tok/s exactly
