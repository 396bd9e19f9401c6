"""Provenance over adb against a real adbd on loopback (tests/adbd/run-adb-tests.sh; elsewhere it skips):
the model hashed by the device's own sha256sum and cached by the device's stat, the device fingerprint
asked of the device, and a whole campaign's manifest carrying them."""

from __future__ import annotations

import hashlib
import json
import os
from io import StringIO

import pytest
from rich.console import Console

from harness.campaigns.provenance import cache_path, device_fingerprint, model_sha256, target_sha256
from harness.campaigns.runner import run_campaign
from harness.formats.manifest import load_manifest
from harness.report.checker import check_folder
from tests.helpers.sh_engine import adb_campaign

SERIAL = os.environ.get("BMOE_ADB_TEST_SERIAL")
pytestmark = [
    pytest.mark.adb,
    pytest.mark.skipif(SERIAL is None, reason="needs the loopback adbd: run tests/adbd/run-adb-tests.sh"),
]

ENGINE = r"""#!/bin/sh
n=4; csv=""; m=""
while [ $# -gt 0 ]; do
  case "$1" in
    -m) m="$2"; shift 2;; -n) n="$2"; shift 2;; -p) shift 2;; --csv) csv="$2"; shift 2;;
    --version) echo "sh-engine 2"; exit 0;; *) shift;;
  esac
done
{ echo "# bmoe_metrics v2"; echo "step,steps,wall_ms,read_bytes"
  i=0; while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "$i,$n,100,1048576"; done
  echo "# summary tokens=$n"; } > "$csv"
"""


def test_the_device_hashes_its_own_copy_once(tmp_path, monkeypatch):
    from harness.targets.adb import AdbTarget

    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    local = tmp_path / "model.gguf"
    local.write_bytes(os.urandom(20000))
    t = AdbTarget(serial=SERIAL)
    remote = t.stage(local, "model")
    want = hashlib.sha256(local.read_bytes()).hexdigest()
    assert model_sha256(t, remote) == {"model.gguf": want}
    cache = json.loads(cache_path().read_text())
    (key,) = cache
    assert key.startswith(f"adb:{SERIAL}:") and cache[key] == want
    cache[key] = "e" * 64  # the device's stat is the key: the cached value answers
    cache_path().write_text(json.dumps(cache))
    assert target_sha256(t, remote) == "e" * 64
    fp = device_fingerprint(t, t.describe())
    assert fp.kind == "adb" and fp.kernel  # a Linux adbd has no getprop: fingerprint, SoC, Android unknown
    t.close()


def test_a_campaign_over_adb_records_provenance(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    p = adb_campaign(tmp_path, ENGINE, name="adbprov", serial=SERIAL, keys="""\
        repeats: 1
        tokens: 4
        warmup_tokens: 0
        cooldown: {mem_available_min_mib: 64, max_wait_s: 5}
        timeout_s: 60
        axes:
          - {flag: --x, values: [1]}
        """)
    eng, model = tmp_path / "sh-engine", tmp_path / "model.gguf"
    res = run_campaign(p, root=tmp_path / "bd", console=Console(file=StringIO()))
    assert res.n_failed == 0
    m = load_manifest(res.folder)
    pv = m.provenance
    assert pv.model_sha256 == {"model.gguf": hashlib.sha256(model.read_bytes()).hexdigest()}
    assert pv.engines["external"].version == "sh-engine 2"
    assert pv.engines["external"].sha256 == hashlib.sha256(eng.read_bytes()).hexdigest()  # hashed on the device
    assert all(r.model_sha256 == pv.model_sha256 for r in m.runs)
    # a Linux adbd is not an Android device: the check says which part of the fingerprint is missing
    problems = check_folder(res.folder).problems
    assert problems == ["provenance: device fingerprint lacks fingerprint, soc, android"], problems
