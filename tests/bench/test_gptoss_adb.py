"""The shipped phone campaign, campaigns/gptoss.yaml, unedited, run end to end over adb against the loopback
adbd (tests/adbd/run-adb-tests.sh; anywhere else it skips): only `--set` overrides point it at a tiny gpt-oss
model and the Python engine, both pushed to the "device" and run there as on a phone; the CSVs pulled back,
the report written and checked."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from harness.bench_cli import main as bench_main
from harness.formats.manifest import load_manifest, raw_file_changes
from harness.formats.metrics_csv import read_metrics
from harness.report.build import check_report
from harness.synth import make_model
from harness.synth.shapes import shape_spec

SERIAL = os.environ.get("BMOE_ADB_TEST_SERIAL")
pytestmark = [
    pytest.mark.adb,
    pytest.mark.engine,
    pytest.mark.skipif(SERIAL is None, reason="needs the loopback adbd: run tests/adbd/run-adb-tests.sh"),
]

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN = REPO / "campaigns" / "gptoss.yaml"
TOKENS = 8


def _engine_wrapper(path: Path) -> Path:
    """The "device's" engine: a dash script running this venv's Python engine (the loopback device shares
    this machine's filesystem, and adbd gives its shell an empty environment, hence PYTHONPATH here)."""
    path.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} "
                    f"-m harness.engine.cli \"$@\"\n")
    path.chmod(0o755)
    return path


def _n_tokens(model: Path, text: str) -> int:
    """Tokens of `text` as the engine tokenizes a prompt (BOS added, special tokens parsed)."""
    L = pytest.importorskip("llama_cpp")
    llm = L.Llama(model_path=str(model), vocab_only=True, verbose=False)
    try:
        return len(llm.tokenize(text.encode(), add_bos=True, special=True))
    finally:
        llm.close()


def test_gptoss_campaign_over_adb_with_set_overrides(tmp_path):
    pytest.importorskip("llama_cpp")
    (model,) = make_model(tmp_path / "gpt-oss-tiny.gguf", shape_spec("tiny", arch="gpt-oss"))
    engine = _engine_wrapper(tmp_path / "bmoe-py")
    sets = [
        f"target.serial={SERIAL}",
        f"model.push_from={model}",  # replaces the file's model.path
        f"engine.push_from={engine}",  # replaces the file's engine.path
        f"tokens={TOKENS}", "warmup_tokens=2", "repeats=1", "timeout_s=120",
        # no thermal zone on the loopback device: the CPU condition goes unchecked (recorded, not waited on)
        "cooldown.mem_available_min_mib=64", "cooldown.max_wait_s=10", "cooldown.poll_s=1",
        "flags.-t=2", "flags.-c=256",
        # the --cache-mb values (3000 base; 0/1500/4500) stay: a fixed budget above all experts is accepted
    ]
    out = tmp_path / "bd"
    assert bench_main(["run", str(CAMPAIGN), "--out", str(out), *[a for s in sets for a in ("--set", s)]]) == 0
    (folder,) = [d for d in out.iterdir() if d.is_dir()]

    m = load_manifest(folder)
    assert m.status == "complete" and m.target.kind == "adb" and m.target.serial == SERIAL
    assert m.campaign.overrides == sets
    assert shlex.split(m.reproduce) == ["bmoe-bench", "run", str(CAMPAIGN), *[a for s in sets for a in ("--set", s)]]
    assert m.engine.version.startswith("bmoe ")  # asked of the engine on the device
    cells = {c.index: c for c in m.campaign.cells}
    assert [c.label for c in cells.values()] == [
        "base", "--cache-mb=0", "--cache-mb=1500", "--cache-mb=4500", "--n-expert-used=2",
        "--io-threads=1", "--io-threads=2", "--io-threads=8", "--dense-weights=mmap"]
    assert len(m.runs) == len(cells)

    rendered = f"<|start|>user<|message|>{m.campaign.prompt}<|end|><|start|>assistant"  # llama.cpp's harmony
    n_chat, n_raw = _n_tokens(model, rendered), _n_tokens(model, m.campaign.prompt)
    for r in m.runs:
        assert r.status == "ok", (r.run_id, r.reason)
        assert r.tokens == TOKENS and r.argv[0] == "/data/local/tmp/bmoe/bmoe-py"  # staged, run on the device
        assert r.gate.unchecked and "cpu temperature" in r.gate.unchecked[0] and not r.gate.gave_up
        assert r.sha256 and "metrics.csv" in r.sha256
        mt = read_metrics(folder / "runs" / r.run_id / "metrics.csv")  # the pulled CSV
        assert mt.format == "bmoe_metrics v2" and len(mt.rows) == TOKENS
        assert (mt.meta["arch"], mt.meta["mode"]) == ("gpt-oss", "stream")
        assert mt.meta["model_file"] == "/data/local/tmp/bmoe/gpt-oss-tiny.gguf"
        want = {"-t": 2, "-c": 256, "--cache-mb": 3000, "--io-threads": 4, **cells[r.cell].varied}
        got = {"-t": mt.meta["cfg.threads"], "-c": mt.meta["cfg.ctx"], "--cache-mb": mt.meta["cfg.cache_mb"],
               "--io-threads": mt.meta["cfg.io_threads"]}
        assert got == {k: str(want[k]) for k in got}, r.run_id
        assert mt.meta["cfg.chatml"] == "True" and mt.meta["cfg.n_predict"] == str(TOKENS)
        # the original's recipe ran on the device: the harmony template with reasoning suppressed (the
        # assistant turn prefilled into the final channel: longer than llama.cpp's plain harmony form), and
        # the dense weights in anonymous memory except in the one cell that varies them
        assert mt.meta["cfg.no_think"] == "True" and "harmony final channel" in mt.meta["no_think"]
        assert int(mt.summary()["n_prompt"]) > n_chat > n_raw
        assert mt.meta["dense_weights"] == cells[r.cell].varied.get("--dense-weights", "anon")

    assert raw_file_changes(folder, m) == []
    assert (folder / "findings.md").is_file() and check_report(folder) == []
    assert "could not check cpu temperature" in (folder / "findings.md").read_text()  # said, not hidden
