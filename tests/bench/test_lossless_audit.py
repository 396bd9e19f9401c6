"""The lossless-output audit (harness.report.audit): a real campaign of the fake engine (a real process
writing token ids) where a lossless knob flips one token is caught, run by run, as findings.md's first line
and a `bmoe-bench check` failure; a lossy cell's divergence is reported, not flagged; every bmoe flag is
classified on purpose."""

from __future__ import annotations

import subprocess
import textwrap

from harness.campaigns.runner import run_campaign
from harness.engine.config import SPECS
from harness.report.audit import OUTPUT_SETTINGS, audit, bmoe_lossless, classify, compare
from harness.report.build import build_report, write_report
from harness.report.checker import check_folder
from harness.report.collect import load_campaign_data
from tests.helpers.runner import BENCH, engine, quiet


def _campaign(tmp_path, bug_step: int):
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\1" * 4096)
    p = tmp_path / "audit.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: audit
        model: {{path: {model}}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10, --bug-flip-with-cache: {bug_step}}}
        repeats: 2
        tokens: 8
        warmup_tokens: 1
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes:
          - flag: --cache-mb
            values: [64]
          - flag: --n-expert-used
            values: [4]
        """))
    res = run_campaign(p, root=tmp_path / "bench-data", console=quiet())
    assert res.n_failed == 0
    return res.folder


def test_a_lossless_cell_that_flips_one_token_is_caught_and_a_lossy_one_only_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    folder = _campaign(tmp_path, bug_step=3)
    a = audit(load_campaign_data(folder))
    kinds = {c.label: (c.kind, c.why) for c in a.cells}
    assert kinds == {"base": ("lossless", []), "--cache-mb=64": ("lossless", []),
                     "--n-expert-used=4": ("lossy", ["--n-expert-used"])}
    # run by run: each run of the cache cell against the base run of its round, first difference at step 3
    assert a.violations() == [
        f"lossless cell '--cache-mb=64' run r0{i}-c01 differs from base run r0{i}-c00 at step 3 (7 of 8 token ids "
        f"identical)" for i in (1, 2)]
    lossy = next(c for c in a.cells if c.kind == "lossy")
    assert lossy.violations == [] and lossy.first_diff.first_diff == 5 and lossy.identical == 0.5

    write_report(folder)
    text = (folder / "findings.md").read_text()
    first = text.splitlines()[0]
    assert first.startswith("**LOSSLESS AUDIT FAILED**: lossless cell '--cache-mb=64' differs from its base 'base' "
                            "in run r01-c01 from step 3, r02-c01 from step 3")
    assert "| --n-expert-used=4 | base | lossy (--n-expert-used) | 2 | 50.0% | r01-c02 at step 5 |" in text
    assert "| --cache-mb=64 | base | lossless **VIOLATION** | 2 | 87.5% | r01-c01 at step 3 |" in text

    res = check_folder(folder)
    assert res.problems == a.violations()
    r = subprocess.run([*BENCH, "check", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert r.stderr.splitlines()[:2] == [f"{folder}: {v}" for v in a.violations()]
    r = subprocess.run([*BENCH, "report", str(folder), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "differs from base run r01-c00 at step 3" in r.stderr


def test_the_same_campaign_without_the_bug_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("BMOE_HASH_CACHE", str(tmp_path / "hashes.json"))
    folder = _campaign(tmp_path, bug_step=0)
    a = audit(load_campaign_data(folder))
    assert a.violations() == [] and a.headline() is None
    assert [c.identical for c in a.cells] == [1.0, 1.0, 0.5]
    assert not build_report(folder, with_plots=False).texts["findings.md"].startswith("**LOSSLESS")
    res = check_folder(folder)
    assert res.ok, res.problems
    r = subprocess.run([*BENCH, "check", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith(f"{folder}: ok"), r.stderr


def test_every_bmoe_flag_is_classified():
    """A new flag must be declared lossy in the flag table, listed as an output setting, or be one of these
    (knobs of how the output is computed): the audit then holds it to byte-identical output."""
    lossless = {s.name for s in SPECS if not s.flag.lossy and s.name not in OUTPUT_SETTINGS}
    assert lossless == {
        "threads", "moe_stream", "cache_mb", "cache_ceil_mb", "force_cache", "cache_preload", "io_threads",
        "prefetch", "predict_prefetch", "predict_spec_max", "predict_min_recall", "prefetch_lanes", "odirect",
        "recycle_pages",
        "evict_thread",
        "cache_policy", "dense_weights", "load_populate", "csv", "progress", "replies", "route_trace", "io_trace",
        "compute_trace", "ngram", "mtp", "draft", "ngram_size",
        # teacher-forced scoring instead of generating (a campaign sets them only from its fidelity section)
        "fidelity_ref", "fidelity_top_k", "fidelity_chunks", "fidelity_against", "fidelity_csv",
        "fidelity_decode"}
    assert OUTPUT_SETTINGS <= {s.name for s in SPECS}


def test_classify():
    assert classify({"--cache-mb": 64, "-t": 2, "--ngram": True}, external=False) == ("lossless", [])
    assert classify({"--route-ahead": 2, "--cache-mb": 0}, external=False) == ("lossy", ["--route-ahead"])
    assert classify({"--temp": 0.7}, external=False) == ("setting", ["--temp"])
    assert classify({"engine": "cxx", "--io-threads": 1}, external=True) == ("lossless", [])
    assert classify({"--cache-policy": "lru"}, external=True) == ("lossy", ["--cache-policy"])
    assert bmoe_lossless("--no-evict-thread") and not bmoe_lossless("--seed") and not bmoe_lossless("--nope")


def test_compare_goes_turn_by_turn_and_counts_a_shorter_run_as_differing_where_it_stops():
    a = [(0, 5), (0, 6), (0, 7)]
    assert compare(a, a) == (3, 3, None)
    assert compare(a, a[:2]) == (3, 2, (0, 3))
    assert compare(a, [(0, 5), (0, 9), (0, 7)]) == (3, 2, (0, 2))
    # a reply one token longer in the first prompt does not shift the second prompt's comparison
    assert compare([(0, 5), (1, 6), (1, 7)], [(0, 5), (0, 8), (1, 6), (1, 7)]) == (4, 3, (0, 2))


def test_on_an_engines_axis_each_engine_is_held_to_its_own_base():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "bench-data" / "2026-12-01-peer-cxx"
    a = audit(load_campaign_data(folder))
    bases = {c.label: a.cells[c.base].label for c in a.cells}
    assert bases["bmoe --io-threads=1"] == "bmoe base" and bases["cxx --io-threads=1"] == "cxx base"
    bmoe = [c for c in a.cells if c.label.startswith("bmoe")]
    assert all(c.kind == "lossless" and c.identical == 1.0 for c in bmoe)
    cxx = [c for c in a.cells if c.label.startswith("cxx")]  # the C++ CSV has no token_id column
    assert all(c.kind == "unaudited" and c.why == ["no token_id column: the engine records no token ids"] for c in cxx)
