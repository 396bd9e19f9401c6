"""A fidelity campaign over adb (the loopback adbd of tests/adbd/run-adb-tests.sh; anywhere else it skips): the
Python engine as the device's external engine (`fidelity.python_engine: true`), the reference made on the device and
pulled into the folder, staged back for every scoring run, each scored cell's figures pulled into its run."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from harness.bench_cli import main as bench_main
from harness.formats.fidelity import read_fidelity_csv
from harness.formats.folder import FIDELITY_CSV, FIDELITY_REF
from harness.formats.manifest import load_manifest, run_dir
from harness.report.build import check_report
from harness.synth import make_model
from harness.synth.shapes import shape_spec
from tests.helpers.adbd import SERIAL

pytestmark = [pytest.mark.adb, pytest.mark.engine]

REPO = Path(__file__).resolve().parents[2]
CAMPAIGN = """\
name: fidelity-adb
model: {{push_from: {model}}}
target: {{kind: adb, serial: {serial}}}
engine: {{kind: external, push_from: {engine}}}
flags: {{-t: 1, -c: 256, --moe-stream: true, --cache-mb: 4, --n-expert-used: 4}}
axes:
  - {{flag: --n-expert-used, values: [4, 2]}}
  - {{flag: --cache-policy, values: [aged-markov, lru]}}
repeats: 1
tokens: 8
cooldown: {{mem_available_min_mib: 64, max_wait_s: 10, poll_s: 1}}
timeout_s: 120
fidelity:
  text: "{text}"
  ctx: 32
  chunks: 3
  cells: all
  python_engine: true
"""


def test_fidelity_campaign_over_adb_with_the_python_engine(tmp_path):
    pytest.importorskip("llama_cpp")
    (model,) = make_model(tmp_path / "tiny.gguf", shape_spec("tiny", n_layer=2, n_expert=8, n_expert_used=4))
    engine = tmp_path / "bmoe-py"  # the "device's" Python engine (the loopback device shares this filesystem)
    engine.write_text(f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} "
                      f"-m harness.engine.cli \"$@\"\n")
    engine.chmod(0o755)
    text = "A small text about experts and caches, read again and again. " * 4
    p = tmp_path / "c.yaml"
    p.write_text(CAMPAIGN.format(model=model, serial=SERIAL, engine=engine, text=text))
    out = tmp_path / "bd"
    assert bench_main(["run", str(p), "--out", str(out)]) == 0
    (folder,) = [d for d in out.iterdir() if d.is_dir()]
    m = load_manifest(folder)
    assert m.target.kind == "adb" and m.fidelity_ref is not None and m.fidelity_ref.status == "ok"
    assert (folder / FIDELITY_REF).is_file()
    labels = [c.label for c in m.campaign.cells]
    kld = {labels[r.cell]: read_fidelity_csv(run_dir(folder, r.run_id) / FIDELITY_CSV).columns["kld"] for r in m.runs}
    assert not kld["base"].any() and not kld["--cache-policy=lru"].any() and kld["--n-expert-used=2"].mean() > 0
    assert check_report(folder) == []
