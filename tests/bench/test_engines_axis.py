"""The engines axis of a campaign: cells crossed with engines, per-engine spellings and pinned flags, the
manifest's record of every engine, the report's engine ratios, and its refusal when the CSV preambles of
one setting differ in more than the engine. Engines here are the fake engine (a real process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.campaigns.runner import run_campaign
from harness.campaigns.validate import engine_argv_tail, plan_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.errors import UserError
from harness.formats.manifest import load_manifest
from harness.formats.metrics_csv import parse_metrics
from harness.formats.results_csv import read_results
from harness.report.build import build_report, write_report
from harness.report.collect import load_campaign_data
from harness.report.peers import comparable, engine_problems
from tests.helpers.runner import engine, quiet

PEER = Path(__file__).resolve().parents[2] / "campaigns" / "peer-cxx.yaml"


def two_engines(tmp_path: Path, b_spell: str = "{--rate: --speed}", b_flags: str = "{}") -> Path:
    """Engines a and b (both the fake engine): the campaign's --rate is spelt --speed by a, as b_spell says by b."""
    exe = engine(tmp_path)
    model = tmp_path / "model.bin"
    model.write_bytes(b"\0" * 4096)
    p = tmp_path / "e.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: eng
        model: {{path: {model}}}
        engines:
          a: {{kind: external, path: {exe}, spell: {{--rate: --speed}}}}
          b: {{kind: external, path: {exe}, spell: {b_spell}, flags: {b_flags}}}
        flags: {{-t: 2, --rate: 10}}
        axes:
          - flag: --sleep-ms
            values: [1]
        repeats: 2
        tokens: 6
        warmup_tokens: 1
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        """))
    return p


def test_the_peer_campaign_crosses_every_setting_with_both_engines():
    plan = plan_campaign(PEER, check_files=False)
    c = plan.campaign
    assert list(c.engines) == ["bmoe", "cxx"]
    assert [x.engine for x in plan.cells] == ["bmoe", "cxx"] * 5  # side by side, reference first
    for x in plan.cells:
        assert plan.cells[x.setting].engine == "bmoe" and plan.cells[x.setting].flags == x.flags
    bm, cx = (engine_argv_tail(c, plan.cells[i], model="M", csv="C", progress=True) for i in (2, 3))
    assert "--cache-policy" in bm and "--cache-policy" not in cx  # the C++ has only LRU: spelt null
    assert bm[bm.index("--cache-mb") + 1] == cx[cx.index("--cache-mb") + 1] == "160"
    for pinned in ("-t", "-c", "--force-cache", "--dense-weights", "--io-threads"):
        assert pinned in bm and pinned in cx


def test_spellings_and_an_engines_own_flags_apply_to_its_cells_only(tmp_path):
    plan = plan_campaign(two_engines(tmp_path, b_spell="{--rate: null}", b_flags="{--fail: 0}"))
    a, b = plan.cells[0], plan.cells[1]
    ta = engine_argv_tail(plan.campaign, a, model="M", csv=None, progress=False)
    tb = engine_argv_tail(plan.campaign, b, model="M", csv=None, progress=False)
    assert ta[ta.index("--speed") + 1] == "10" and "--rate" not in ta and "--fail" not in ta
    assert "--rate" not in tb and "--speed" not in tb and tb[-2:] == ["--fail", "0"]
    assert b.varied == {"engine": "b"} and plan.cells[3].varied == {"--sleep-ms": 1, "engine": "b"}


@pytest.mark.parametrize("body, message", [
    ("engine: bmoe\nengines: {a: bmoe, b: bmoe}\n", "either engine"),
    ("engines: {a: bmoe}\n", "at least two"),
    ("engines: {a: bmoe, b: {kind: external}}\n", "exactly one of path or push_from"),
    ("engines: {a: bmoe, b: {kind: bmoe, spell: {-t: null}}}\n", "bmoe's flags are the campaign's own"),
    ("engines: {a: bmoe, b: {kind: external, path: x, flags: {--cache-mb: 1}}}\n", "is varied by the campaign"),
    ("engines: {a: bmoe, b: {kind: external, path: x, spell: {--x: --cache-mb}}}\nflags: {--x: 1}\n",
     "--x and --cache-mb are both spelt --cache-mb"),
])
def test_engines_mistakes_are_one_line_each(tmp_path, body, message):
    p = tmp_path / "c.yaml"
    p.write_text("name: t\nmodel: {recipe: {n_layer: 2}}\naxes: [{flag: --cache-mb, values: [0, 64]}]\n" + body)
    with pytest.raises(CampaignError, match=message):
        plan_campaign(p, check_files=False)


def test_a_run_records_every_engine_and_the_report_compares_them(tmp_path):
    p = two_engines(tmp_path, b_spell="{--rate: null}", b_flags="{--speed: 20}")
    root = tmp_path / "bench"
    res = run_campaign(p, root=root, console=quiet())
    assert res.n_ok == 8 and res.n_failed == 0
    m = load_manifest(res.folder)
    assert set(m.engines) == {"a", "b"} and m.engines["b"].version == "fake-engine 1.0"
    assert [c.engine for c in m.campaign.cells] == ["a", "b", "a", "b"]
    assert m.runs[1].argv[-2:] == ["--speed", "20"]
    write_report(res.folder)
    text = (res.folder / "findings.md").read_text()
    section = text.split("## Engines side by side", 1)[1].split("\n## ", 1)[0]
    assert "| base | 10.00 [10.00, 10.00] | b | 20.00" in section and "0.50x [" in section  # a/b = 10/20 tok/s
    version, rows = read_results(res.folder / "results.csv")
    assert version == 2 and rows[0]["ratio_method"] == "" and rows[2]["ratio_method"] == "paired t over rounds"
    assert [r["cell"] for r in rows] == ["a base", "b base", "a --sleep-ms=1", "b --sleep-ms=1"]


def test_the_report_refuses_cells_that_differ_in_more_than_the_engine(tmp_path):
    p = two_engines(tmp_path, b_spell="{-t: null, --rate: --speed}")  # b runs at its own default -t 4
    res = run_campaign(p, root=tmp_path / "bench", console=quiet())
    data = load_campaign_data(res.folder)
    bad = engine_problems(data)
    assert len(bad) == 2 and "threads 2 vs 4" in bad[0]
    with pytest.raises(UserError, match="refusing to compare engines: cells 'a base' and 'b base' differ"):
        build_report(res.folder)


CXX_HEAD = """\
# bmoe_metrics v2
# engine=0.9.1
# model=/m/model.gguf arch=qwen3moe n_layer=12 n_expert=64 n_expert_used=6 threads=1 n_ctx=512 n_ubatch=512 chatml=0
# moe_stream=1 cache_mb=160 cache_auto=0 cache_floor_mb=1536 cache_ceil_mb=0 force_cache=1 load_all=0 io_threads=4 \
o_direct=1 overlap=0 io_two_wave=0 prefetch=0 route_ahead=0 predict_prefetch=0 predict_log=0 predict_spec_max=2 \
prefetch_sync=0 dense_weights=anon drop_cold_frac=0 drop_renorm=1 drop_prefill=0
# temp=0 top_k=40 top_p=0.95 seed=4294967295 compute_trace_layers=0 spec=none spec_draft_max=3 mtp_p_min=0 \
ngram_min_match=3
step,steps,wall_ms
1,2,10.0
2,2,11.0
# summary tokens=2 s/tok=0.011 tok/s=95.2 n_prompt=45 cache_budget_MiB=160.0
"""


def test_the_cxx_preamble_reads_as_separate_keys_in_the_shared_vocabulary():
    m = parse_metrics(CXX_HEAD)
    assert m.meta["engine"] == "0.9.1" and m.meta["model"] == "/m/model.gguf" and m.meta["io_threads"] == "4"

    class Run:
        metrics = m
    got = comparable(Run())  # type: ignore[arg-type]
    assert got == {"model": "model.gguf", "threads": "1", "n_ctx": "512", "moe_stream": "1", "cache_mib": "160",
                   "cache_policy": "lru", "io_threads": "4", "o_direct": "1", "dense_weights": "anon",
                   "n_expert_used": "6", "temp": "0", "chatml": "0", "prefetch": "0", "predict_prefetch": "0",
                   "route_ahead": "0", "drop_cold_frac": "0", "load_all": "0", "n_prompt": "45", "n_decode": "2"}
