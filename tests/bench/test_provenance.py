"""Provenance in the manifest (v3): the model's sha256 hashed once and cached by device, inode, size and
mtime; the engine's identity; the device fingerprint; every run's model hash, a changed model failing the
run; older manifests still load (as legacy); findings show it. Real campaigns of the fake engine."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from harness.campaigns.provenance import (
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_PYTHON,
    bmoe_identity,
    cache_path,
    local_sha256,
    model_sha256,
)
from harness.campaigns.runner import run_campaign
from harness.formats.manifest import VERSION, legacy, load_manifest
from harness.formats.outcome import read_outcome
from harness.report.build import build_report
from harness.report.checker import check_folder
from tests.helpers.runner import campaign, quiet

REPO = Path(__file__).resolve().parents[2]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_campaign_records_its_provenance_and_fails_a_run_whose_model_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    p = campaign(tmp_path, fail_axis=True, repeats=1)
    model, exe = tmp_path / "model.bin", tmp_path / "fake-engine"
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = load_manifest(res.folder)
    assert m.version == VERSION == 3 and not legacy(m)
    pv = m.provenance
    assert pv.model_sha256 == {"model.bin": sha(model)}
    assert pv.engines["external"].version == "fake-engine 1.0" and pv.engines["external"].sha256 == sha(exe)
    assert pv.device.kind == "local" and pv.device.kernel == os.uname().release and pv.device.cpu_model
    for r in m.runs:
        assert r.model_sha256 == pv.model_sha256
        assert read_outcome(res.folder / "runs" / r.run_id / "outcome.json").model_sha256 == pv.model_sha256
    no_result = ["cell 2 ('--fail=3'): every run failed, so it has no result"]  # the only problem: provenance is whole
    assert check_folder(res.folder).problems == no_result

    md = build_report(res.folder, with_plots=False).texts["findings.md"]
    assert f"- **Model file**: `model.bin` sha256 `{sha(model)}` (hashed on the target" in md
    assert f"- **Engine build** (external): `fake-engine 1.0`, binary sha256 `{sha(exe)}`." in md
    assert f"kernel {os.uname().release}" in md

    model.write_bytes(b"\2" * 4096)  # another model under the same name: the retried run must not use it
    res2 = run_campaign(p, root=tmp_path / "bd", console=quiet(), retry_failed=True)
    assert res2.folder == res.folder and res2.n_failed == 1
    r = next(r for r in load_manifest(res.folder).runs if r.cell == 2)
    assert r.status == "failed" and r.argv is None  # never started
    assert r.reason.startswith("the model file changed since the campaign started (model.bin: "
                               f"{sha(model)[:12]} (campaign: {pv.model_sha256['model.bin'][:12]})")
    assert r.model_sha256 == {"model.bin": sha(model)}
    assert check_folder(res.folder).problems == no_result  # the refused run is accounted for by its reason

    # an ok run recorded with another model than the campaign's is a problem
    mj = json.loads((res.folder / "manifest.json").read_text())
    mj["runs"][0]["model_sha256"] = {"model.bin": "0" * 64}
    (res.folder / "manifest.json").write_text(json.dumps(mj))
    assert "run r01-c00 ran with another model file than the campaign's (sha256 differs)" in \
        check_folder(res.folder).problems


def test_the_hash_is_computed_once_per_file_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "c" / "hashes.json"))
    f = tmp_path / "m.gguf"
    f.write_bytes(os.urandom(1 << 16))
    assert local_sha256(f) == sha(f)
    cache = json.loads(cache_path().read_text())
    st = f.stat()
    key = f"local:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
    assert list(cache) == [key]
    cache[key] = "f" * 64  # the cache answers as long as the file's identity holds
    cache_path().write_text(json.dumps(cache))
    assert local_sha256(f) == "f" * 64
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: hashed again
    assert local_sha256(f) == sha(f)
    assert len(json.loads(cache_path().read_text())) == 2


def test_every_shard_of_a_split_model_is_hashed(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    for i in (1, 2):
        (tmp_path / f"m-0000{i}-of-00002.gguf").write_bytes(bytes([i]) * 100)

    class Local:
        kind = "local"

    got = model_sha256(Local(), str(tmp_path / "m-00001-of-00002.gguf"))
    assert got == {f"m-0000{i}-of-00002.gguf": sha(tmp_path / f"m-0000{i}-of-00002.gguf") for i in (1, 2)}


def test_bmoe_identity_names_the_source_tree_and_the_pinned_llama_cpp(tmp_path, monkeypatch):
    script = tmp_path / "bmoe"
    script.write_text(f"#!{sys.executable}\nprint('bmoe')\n")
    script.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the interpreter then loads harness from this checkout
    ident = bmoe_identity("bmoe 0.1.0", [str(script)])
    head = os.popen(f"git -C {REPO} rev-parse HEAD").read().strip()
    assert ident.commit == head and ident.dirty in (True, False)
    assert ident.llama_cpp == f"{LLAMA_CPP_COMMIT} (llama-cpp-python {LLAMA_CPP_PYTHON})"


def test_the_llama_cpp_commit_belongs_to_the_pinned_release():
    pins = re.findall(r'"llama-cpp-python==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert pins == [LLAMA_CPP_PYTHON], "the llama-cpp-python pin moved: update LLAMA_CPP_COMMIT from its CHANGELOG"


def test_an_older_manifest_loads_as_legacy_and_passes_the_check_with_a_note():
    folder = REPO / "bench-data" / "2026-11-30-demo"
    raw = json.loads((folder / "manifest.json").read_text())
    m = load_manifest(folder)
    if raw["version"] < 3:
        assert m.upgraded_from == raw["version"]
    assert legacy(m) and m.provenance is None
    res = check_folder(folder)
    assert res.ok and res.notes[0].startswith("legacy folder (from before manifest v3)")
    md = build_report(folder, with_plots=False).texts["findings.md"]
    assert "- **Provenance**: not recorded (a folder from before manifest v3)" in md


def test_a_dirty_engine_tree_is_a_warning_and_an_older_manifest_still_loads(tmp_path, monkeypatch):
    from harness.formats.manifest import parse_manifest, save_manifest

    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    res = run_campaign(campaign(tmp_path, repeats=1), root=tmp_path / "bd", console=quiet())
    m = load_manifest(res.folder)
    e = m.provenance.engines["external"]
    e.llama_cpp, e.commit, e.dirty = "0c1e57098", "a" * 40, True
    save_manifest(res.folder, m)
    md = build_report(res.folder, with_plots=False).texts["findings.md"]
    assert "- dirty tree: engine external ran from a source tree with uncommitted changes (commit aaaaaaaaaaaa)" in md
    assert "source commit `aaaaaaaaaaaa` **with uncommitted changes**" in md
    checked = check_folder(res.folder)
    assert checked.ok and "engine external ran from a tree with uncommitted changes (commit aaaaaaaaaaaa)" in \
        checked.notes

    raw = json.loads((res.folder / "manifest.json").read_text())  # as v2 wrote it: no provenance, no run hashes
    del raw["provenance"]
    for r in raw["runs"]:
        r.pop("model_sha256", None)
    old = parse_manifest({**raw, "version": 2}, res.folder / "manifest.json")
    assert old.upgraded_from == 2 and legacy(old) and old.runs[0].model_sha256 is None
