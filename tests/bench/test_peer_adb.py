"""The shipped phone campaign for the C++ engine, campaigns/qwen3-30b.yaml, unedited, run over adb against the
loopback adbd (tests/adbd/run-adb-tests.sh; anywhere else it skips) with the real native `bmoe-cli` built by
scripts/build-peer.sh (skips without it): `--set` overrides push that binary and a small model to the
"device" and run there as on a phone; its CSVs are pulled back, read, and the report written and checked."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from harness.bench_cli import main as bench_main
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.formats.metrics_csv import read_metrics
from harness.report.build import check_report
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.helpers.peer import peer_cli

SERIAL = os.environ.get("BMOE_ADB_TEST_SERIAL")
pytestmark = [
    pytest.mark.adb,
    pytest.mark.engine,
    pytest.mark.skipif(SERIAL is None, reason="needs the loopback adbd: run tests/adbd/run-adb-tests.sh"),
]

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN = REPO / "campaigns" / "qwen3-30b.yaml"
TOKENS = 8


def test_the_phone_campaign_runs_the_native_cxx_engine_over_adb(tmp_path):
    cli = peer_cli()
    (model,) = make_model(tmp_path / "small.gguf", shape_spec("small"))  # 8 layers, 32 experts, top-4
    sets = [
        f"target.serial={SERIAL}",
        f"model.push_from={model}",  # replaces the file's model.path
        f"engine.push_from={cli}",  # replaces the file's engine.path: the binary is pushed, run on the device
        f"tokens={TOKENS}", "warmup_tokens=2", "repeats=1", "timeout_s=120",
        "cooldown.mem_available_min_mib=64", "cooldown.max_wait_s=10", "cooldown.poll_s=1",
        "flags.-t=1", "flags.-c=256",
        # the --cache-mb values (4000 base; 0/2000/6000) stay: all at or above the C++ engine's 1500 MiB floor
    ]
    out = tmp_path / "bd"
    assert bench_main(["run", str(CAMPAIGN), "--out", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    (folder,) = [d for d in out.iterdir() if d.is_dir()]

    m = load_manifest(folder)
    assert m.status == "complete" and m.target.kind == "adb" and m.engine.kind == "external"
    assert shlex.split(m.reproduce)[:3] == ["bmoe-bench", "run", str(CAMPAIGN)]
    cells = {c.index: c for c in m.campaign.cells}
    assert [c.label for c in cells.values()] == [
        "base", "--cache-mb=0", "--cache-mb=2000", "--cache-mb=6000", "--n-expert-used=6", "--n-expert-used=4",
        "--io-threads=1", "--io-threads=2", "--io-threads=8"]
    texts = []
    for r in m.runs:
        assert r.status == "ok", (r.run_id, r.reason)
        assert r.argv[0] == "/data/local/tmp/bmoe/bmoe-cli" and r.tokens == TOKENS
        mt = read_metrics(folder / "runs" / r.run_id / "metrics.csv")  # the C++ engine's own CSV, pulled
        assert mt.format == "bmoe_metrics v2" and len(mt.rows) == TOKENS
        assert mt.meta["engine"] == m.engine.version.split()[-1] or mt.meta["engine"] in m.engine.version
        assert mt.meta["model"] == "small.gguf" and mt.meta["arch"] == "qwen3moe"  # it records the basename
        want = {"--cache-mb": 4000, "--io-threads": 4, "--n-expert-used": 4, **cells[r.cell].varied}
        got = {"--cache-mb": mt.meta["cache_mb"], "--io-threads": mt.meta["io_threads"],
               "--n-expert-used": mt.meta["n_expert_used"]}
        assert got == {k: str(want[k]) for k in got}, r.run_id
        assert (mt.meta["threads"], mt.meta["n_ctx"], mt.meta["moe_stream"]) == ("1", "256", "1")
        texts.append((folder / "runs" / r.run_id / "engine.log").read_text(errors="replace"))
    assert all("generation: " in t or "=== perf ===" in t for t in texts)
    assert raw_file_changes(folder, m) == []
    assert (folder / "findings.md").is_file() and check_report(folder) == []
