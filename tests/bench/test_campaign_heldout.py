"""A fidelity campaign scored one token at a time (`fidelity.decode: true`) is the held-out quality campaign: its
plan (the cells' own decode-time flags, --fidelity-decode on every scoring run, nothing added or refused), its text
checked as untrusted input, and end to end on a synthetic model: per-position records with log-probabilities, the
findings' held-out section (perplexity, accuracy, paired comparison against the reference) and `bmoe-bench grade`
regrading it from the records alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.campaigns.fidelity import MAX_TEXT_BYTES, against_argv_tail, plan_scoring, ref_argv_tail
from harness.campaigns.runner import plan_record
from harness.campaigns.validate import plan_campaign
from tests.helpers.campaign import FIDELITY_GOOD as GOOD
from tests.helpers.campaign import FIDELITY_TEXT as TEXT
from tests.helpers.campaign import errors, write

REPO = Path(__file__).resolve().parents[2]
DECODE = GOOD.replace("  chunks: 4\n", "  chunks: 2\n  cells: all\n  decode: true\n")


def test_decode_plans_the_cells_own_flags(tmp_path):
    ahead = (DECODE.replace(" --drop-cold-experts: 0,", "").replace("  - {flag: --drop-cold-experts, values: [0, "
                                                                       "1.0]}\n", "  - {flag: --route-ahead, values"
                                                                       ": [0, 1]}\n"))
    p = write(tmp_path, ahead.replace("--cache-policy: aged-markov}", "--cache-policy: aged-markov, --route-ahead: 0}"))
    plan = plan_campaign(p)
    s = plan_scoring(plan.campaign, plan.cells)
    assert s.problems == () and len(s.cells) == len(plan.cells) == 4  # route-ahead is scored: it acts in decode
    plan = plan_campaign(write(tmp_path, DECODE, "d.yaml"))
    c = plan.campaign
    drop = next(x for x in plan.cells if x.label == "--drop-cold-experts=1.0")
    argv = against_argv_tail(c, drop, model="m.gguf", ref="/r/fidelity.ref", csv="/t/f.csv")
    assert "--fidelity-decode" in argv and "--drop-in-prefill" not in argv
    ref = ref_argv_tail(c, plan.cells[0], model="m.gguf", text=TEXT, out="/t/fidelity.ref")
    assert "--fidelity-decode" in ref and "--drop-in-prefill" not in ref
    rec = plan_record(plan).fidelity
    assert rec is not None and rec.decode and rec.drop_in_prefill_added == []
    batch = plan_record(plan_campaign(write(tmp_path, GOOD, "b.yaml"))).fidelity
    assert batch is not None and "decode" not in batch.dump()  # older plans keep their hash


def test_the_text_is_untrusted(tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.txt"
    outside.write_text("a text outside the campaign's folder and the checkout\n")
    d = tmp_path / "c"
    d.mkdir()
    p = write(d, DECODE.replace(f'  text: "{TEXT}"\n', f"  text_file: {outside}\n"))
    (line,) = errors(p)
    assert "outside the campaign's folder and this checkout" in line
    (d / "link.txt").symlink_to(outside)  # a link inside pointing out is out
    (line,) = errors(write(d, DECODE.replace(f'  text: "{TEXT}"\n', "  text_file: link.txt\n"), "l.yaml"))
    assert "outside the campaign's folder" in line
    with open(d / "big.txt", "wb") as f:
        f.truncate(MAX_TEXT_BYTES + 1)
    (line,) = errors(write(d, DECODE.replace(f'  text: "{TEXT}"\n', "  text_file: big.txt\n"), "g.yaml"))
    assert f"more than the {MAX_TEXT_BYTES} a scored text may have" in line
    inside = REPO / "campaigns" / "fidelity-text.txt"  # in the checkout, from a campaign elsewhere: accepted
    plan_campaign(write(d, DECODE.replace(f'  text: "{TEXT}"\n', f"  text_file: {inside}\n"), "ok.yaml"))


def test_heldout_campaign_end_to_end_and_its_regrade(tmp_path, monkeypatch, capsys):
    from typer.testing import CliRunner

    from harness.bench_cli import app
    from harness.campaigns.runner import run_campaign
    from harness.formats.fidelity import read_fidelity_csv
    from harness.formats.folder import FIDELITY_CSV
    from harness.formats.manifest import load_manifest, run_dir
    from harness.quality.heldout import heldout
    from harness.report.build import check_report, write_report
    from tests.helpers.runner import quiet

    monkeypatch.setenv("BMOE_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    small = DECODE.replace("  - {flag: --cache-policy, values: [aged-markov, lru]}\n", "")
    res = run_campaign(write(tmp_path, small), root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed) == (3, 0)
    f = res.folder
    m = load_manifest(f)
    labels = [c.label for c in m.campaign.cells]
    cols = {labels[r.cell]: read_fidelity_csv(run_dir(f, r.run_id) / FIDELITY_CSV).columns for r in m.runs}
    base = cols["base"]
    assert np.array_equal(base["lp_run"], base["lp_ref"]) and not base["kld"].any()  # the base scores itself
    assert not np.array_equal(cols["--n-expert-used=2"]["lp_run"], base["lp_ref"])
    write_report(f)
    assert check_report(f) == []
    text = (f / "findings.md").read_text()
    section = text.split("## Held-out quality: perplexity and next-token accuracy", 1)[1].split("\n## ", 1)[0]
    assert "one token at a time" in section and "Clopper-Pearson" in section and "McNemar" in section
    assert "The reference's top 256 tokens per position keep " in text  # next to the KLDs
    k2 = cols["--n-expert-used=2"]
    h = heldout(k2["lp_run"], k2["hit"], k2["chunk"])
    (row,) = [x for x in section.splitlines() if x.startswith("| --n-expert-used=2 |")]
    assert row.startswith(f"| --n-expert-used=2 | {h.ppl.mean:.4g} [{h.ppl.low:.4g}, {h.ppl.high:.4g}] | "
                          f"{100 * h.acc.point:.2f} [")
    out = CliRunner().invoke(app, ["grade", str(f)])
    assert out.exit_code == 0, out.output
    assert "regraded from the records" in out.output
    assert f"--n-expert-used=2: perplexity {h.ppl.mean:.4g} [{h.ppl.low:.4g}, {h.ppl.high:.4g}]" in out.output
    assert out.output.count("vs reference") == 3 and not (f / "grades.json").exists()


@pytest.mark.parametrize("name", ["quality-heldout"])
def test_the_shipped_heldout_campaign_scores_every_cell_one_token_at_a_time(name):
    plan = plan_campaign(REPO / "campaigns" / f"{name}.yaml", check_files=False)
    s = plan_scoring(plan.campaign, plan.cells)
    assert s.problems == () and len(s.cells) == len(plan.cells)
    assert plan.campaign.fidelity is not None and plan.campaign.fidelity.decode
    assert {x.label for x in plan.cells} == {"base", "--drop-cold-experts=0.5", "--drop-cold-experts=1.0",
                                             "--n-expert-used=3", "--n-expert-used=2"}
