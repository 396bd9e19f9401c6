"""The campaign's `quality:` block: validation (every rule names file:line), the plan's record of the
questions and the grading rule, the engine flags the harness adds, and the shipped quality campaigns."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from harness.campaigns.questions import prompt_items, quality_record
from harness.campaigns.runner import plan_record
from harness.campaigns.validate import engine_argv_tail, plan_campaign
from harness.engine.config import SPECS
from harness.formats.manifest import plan_hash
from harness.formats.replies import prompts_text, read_prompts, read_replies
from harness.quality.grade import GRADER, GRADER_VERSION
from tests.bench.test_campaign_schema import errors, write

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
name: q
model: {recipe: {n_layer: 2, chat_template: qwen3}}
target: local
flags: {-t: 2, -c: 2048, --moe-stream: true, --cache-mb: 64}
axes:
  - {flag: --n-expert-used, values: [2, 1]}
repeats: 1
tokens: 8
quality:
  suite: gsm8k
  n: 3
  template: "Q: {question}\\nA:"
"""


def test_good_quality_campaign_plans_and_records_questions_and_grader(tmp_path):
    plan = plan_campaign(write(tmp_path, GOOD))
    q = plan.campaign.quality
    assert q is not None and q.n == 3 and q.ids is None
    rec = plan_record(plan)
    assert rec.quality is not None
    assert rec.quality.ids == ["gsm8k-test-0000", "gsm8k-test-0001", "gsm8k-test-0002"]
    assert (rec.quality.grader, rec.quality.grader_version) == (GRADER, GRADER_VERSION)
    items = prompt_items(q)
    assert items[0].prompt.startswith("Q: Janet\u2019s ducks") and items[0].prompt.endswith("\nA:")
    assert rec.quality.prompts_sha256 == hashlib.sha256(prompts_text(items).encode()).hexdigest()
    # the harness hands every run the questions and collects its replies
    argv = engine_argv_tail(plan.campaign, plan.cells[1], model="m.gguf", csv="r.csv", progress=True,
                            prompts="/f/prompts.jsonl", replies="/t/r.replies.jsonl")
    assert argv[argv.index("--prompts-file") + 1] == "/f/prompts.jsonl"
    assert argv[argv.index("--replies") + 1] == "/t/r.replies.jsonl"
    # a plan without a quality block hashes as before (no quality key), one with it differs
    plain = plan_record(plan_campaign(write(tmp_path, GOOD.split("quality:")[0], "p.yaml")))
    assert "quality" not in plain.dump() and plan_hash(plain) != plan_hash(rec)


def test_ids_are_asked_in_their_order(tmp_path):
    p = write(tmp_path, GOOD.replace("n: 3", "ids: [7, 2]"))
    assert quality_record(plan_campaign(p).campaign.quality).ids == ["gsm8k-test-0007", "gsm8k-test-0002"]


def test_prompts_file_roundtrip(tmp_path):
    items = prompt_items(plan_campaign(write(tmp_path, GOOD)).campaign.quality)
    (tmp_path / "p.jsonl").write_text(prompts_text(items), encoding="utf-8")
    assert read_prompts(tmp_path / "p.jsonl") == items


@pytest.mark.parametrize("change, message", [
    (("n: 3", "n: 3\n  ids: [1]"), ":10: quality needs exactly one of n (the first n questions) or ids (a list)"),
    (("  n: 3\n", ""), ":10: quality needs exactly one of n"),
    (("n: 3", "ids: [1, 1]"), ":11: quality.ids: a question is listed twice"),
    (('"Q: {question}\\nA:"', '"Q: no placeholder"'), ":12: quality.template must contain {question} exactly once"),
    (("n: 3", "n: 2000"), ":10: quality.n: 2000 is more than the 1319 GSM8K test questions"),
    (("n: 3", "ids: [1319]"), ":10: quality.ids: 1319 is not a GSM8K test question (0..1318)"),
    (("suite: gsm8k", "suite: mmlu"), ":10: quality.suite must be one of gsm8k, got 'mmlu'"),
    (("-t: 2,", "-t: 2, --prompts-file: x.jsonl,"), ":4: flags: --prompts-file is set by the harness from 'quality'"),
    (("--cache-mb: 64}", "--cache-mb: 64, --temp: 0.7}"), "--prompts-file runs are greedy"),
])
def test_quality_block_problems_name_the_line(tmp_path, change, message):
    p = write(tmp_path, GOOD.replace(*change))
    lines = errors(p)
    assert any(message in x for x in lines), lines


def test_quality_needs_the_bmoe_engine(tmp_path):
    p = write(tmp_path, GOOD.replace("target: local", "target: local\nengine: {kind: external, path: e}"))
    assert any("quality campaigns need engine bmoe" in x for x in errors(p))


DROP = "--drop-cold-experts" in {f for s in SPECS for f in s.flag.flags}


def test_quality_drop_campaign_expands_as_planned():
    """Its schema and cells (the engine's own parser checks its flags once --drop-cold-experts exists)."""
    from harness.campaigns.expand import expand_cells
    from harness.campaigns.schema import load_campaign

    c = load_campaign(REPO / "campaigns" / "quality-drop.yaml")
    assert c.quality is not None and c.quality.n == 100 and c.repeats == 1
    cells = expand_cells(c)
    assert [x.label for x in cells] == ["base", "--drop-cold-experts=0.5", "--drop-cold-experts=0.75",
                                        "--drop-cold-experts=1.0", "--n-expert-used=6"]
    assert cells[0].flags["--drop-cold-experts"] == 0 and cells[0].flags["--n-expert-used"] == 8
    assert all(x.flags["--chatml"] and x.flags["--no-think"] and x.flags["--cache-mb"] for x in cells)
    over = load_campaign(REPO / "campaigns" / "quality-drop.yaml", ["model.path=/m/real.gguf"])
    assert over.model.path == "/m/real.gguf" and over.model.recipe is None


@pytest.mark.skipif(not DROP, reason="--drop-cold-experts is not in this engine yet (issue 12 item 5)")
def test_quality_drop_campaign_validates_against_the_engine():
    plan = plan_campaign(REPO / "campaigns" / "quality-drop.yaml")
    assert len(plan.cells) == 5 and len(plan.runs) == 5


def test_quality_k_campaign_validates():
    plan = plan_campaign(REPO / "campaigns" / "quality-k.yaml")
    assert [x.label for x in plan.cells] == ["base", "--n-expert-used=6", "--cache-policy=lru"]
    assert plan.campaign.quality.n == 100


@pytest.mark.engine
def test_quality_campaign_end_to_end_on_a_synthetic_model(tmp_path, monkeypatch):
    """Runner -> bmoe --prompts-file -> replies committed per run -> grades -> findings -> report --check."""
    from harness.campaigns.runner import run_campaign
    from harness.formats.manifest import load_manifest, run_dir
    from harness.formats.metrics_csv import read_metrics
    from harness.formats.replies import PROMPTS_FILE, REPLIES_FILE
    from harness.report.build import check_report, write_report
    from tests.helpers.runner import quiet

    monkeypatch.setenv("BMOE_MODEL_CACHE", str(tmp_path / "models"))
    p = write(tmp_path, GOOD.replace("--cache-mb: 64}", "--cache-mb: 64, --chatml: true, --no-think: true}")
              .replace("values: [2, 1]", "values: [2, 1]}\n  - {flag: --cache-policy, values: [aged-markov, lru]")
              .replace("-t: 2, -c: 2048,", "-t: 1, -c: 2048, --n-expert-used: 2, --cache-policy: aged-markov,"))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed) == (3, 0)
    m = load_manifest(res.folder)
    assert m.campaign.quality is not None and m.campaign.quality.grader == GRADER
    prompts = read_prompts(res.folder / PROMPTS_FILE)
    assert hashlib.sha256((res.folder / PROMPTS_FILE).read_bytes()).hexdigest() == m.campaign.quality.prompts_sha256
    replies = {}
    for r in m.runs:
        d = run_dir(res.folder, r.run_id)
        assert REPLIES_FILE in r.sha256  # committed with the run, hashed in the manifest
        replies[r.cell] = read_replies(d / REPLIES_FILE)
        assert [x.id for x in replies[r.cell]] == [x.id for x in prompts]
        assert all(x.prompt.startswith("<|im_start|>user\nQ: ") for x in replies[r.cell])
        rows = read_metrics(d / "metrics.csv").rows
        assert sorted(set(rows["turn"])) == [0, 1, 2]  # one engine process, one turn per question
    labels = [c.label for c in m.campaign.cells]
    lru, k1 = labels.index("--cache-policy=lru"), labels.index("--n-expert-used=1")
    assert [x.reply for x in replies[lru]] == [x.reply for x in replies[0]]  # lossless: the base's replies
    assert [x.reply for x in replies[k1]] != [x.reply for x in replies[0]]
    write_report(res.folder)
    assert check_report(res.folder) == []
    f = (res.folder / "findings.md").read_text()
    assert "## Quality (GSM8K)" in f and "The model is synthetic, with random weights" in f
    quality = f.split("## Quality (GSM8K)", 1)[1].split("\n### ", 1)[0]
    (row,) = [x for x in quality.splitlines() if x.startswith("| --cache-policy=lru |")]
    assert row.endswith("| 3/3 |")  # every reply byte for byte the base's
    assert "| 0 | 0 | 1 |" in row  # no discordant question, p = 1
