"""A campaign's `fidelity:` section: validation (file:line, one line per refusal), `--set` on it, which cells are
scored and with which flags, the plan's record; and end to end on a synthetic model: one reference per campaign
(hashed in the manifest), each scored cell's figures in its first-round run, the findings' section, the plot, the
overview's KLD column and `check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.campaigns.fidelity import against_argv_tail, plan_scoring, ref_argv_tail
from harness.campaigns.runner import plan_record
from harness.campaigns.validate import plan_campaign
from harness.formats.manifest import plan_hash
from tests.helpers.campaign import errors, write

REPO = Path(__file__).resolve().parents[2]
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away into the woods. " * 6

GOOD = f"""\
name: f
model: {{recipe: {{n_layer: 2, n_expert: 8, n_expert_used: 4}}}}
target: local
flags: {{-t: 1, --moe-stream: true, --cache-mb: 4, --n-expert-used: 4, --drop-cold-experts: 0,
        --cache-policy: aged-markov}}
axes:
  - {{flag: --n-expert-used, values: [4, 2]}}
  - {{flag: --drop-cold-experts, values: [0, 1.0]}}
  - {{flag: --cache-policy, values: [aged-markov, lru]}}
repeats: 1
tokens: 4
fidelity:
  text: "{TEXT}"
  ctx: 32
  chunks: 4
"""


def _labels(plan, idx):
    return [plan.cells[i].label for i in idx]


def test_lossy_cells_are_scored_and_drops_get_drop_in_prefill(tmp_path):
    plan = plan_campaign(write(tmp_path, GOOD))
    s = plan_scoring(plan.campaign, plan.cells)
    assert s.problems == ()
    assert _labels(plan, s.cells) == ["--n-expert-used=2", "--drop-cold-experts=1.0"]  # lru is lossless
    c = plan.campaign
    drop = next(x for x in plan.cells if x.label == "--drop-cold-experts=1.0")
    argv = against_argv_tail(c, drop, model="m.gguf", ref="/r/fidelity.ref", csv="/t/f.csv")
    assert "--drop-in-prefill" in argv and argv[argv.index("--fidelity-against") + 1] == "/r/fidelity.ref"
    ref = ref_argv_tail(c, plan.cells[0], model="m.gguf", text=TEXT, out="/t/fidelity.ref")
    assert ref[ref.index("-c") + 1] == "32" and ref[ref.index("--fidelity-chunks") + 1] == "4"
    assert ref[ref.index("-p") + 1] == TEXT and "--drop-in-prefill" in ref  # the base's drop 0, neutral
    rec = plan_record(plan)
    assert rec.fidelity is not None and rec.fidelity.scored == list(s.cells) and rec.fidelity.ctx == 32
    # every cell with a drop rule is listed as scored with --drop-in-prefill added
    assert rec.fidelity.drop_in_prefill_added == [x.index for x in plan.cells]
    plain = plan_record(plan_campaign(write(tmp_path, GOOD.split("fidelity:")[0], "p.yaml")))
    assert "fidelity" not in plain.dump() and plan_hash(plain) != plan_hash(rec)


def test_cells_all_scores_every_cell_and_set_works_on_the_section(tmp_path):
    p = write(tmp_path, GOOD)
    plan = plan_campaign(p, overrides=["fidelity.cells=all", "fidelity.ctx=64"])
    assert plan_scoring(plan.campaign, plan.cells).cells == tuple(x.index for x in plan.cells)
    assert plan.campaign.fidelity.ctx == 64
    (tmp_path / "t.txt").write_text(TEXT)
    plan = plan_campaign(p, overrides=["fidelity.text_file=t.txt"])  # replaces the inline text
    assert plan.campaign.fidelity.text is None and plan_record(plan).fidelity.text_file == "t.txt"


@pytest.mark.parametrize("change, message", [
    (("  ctx: 32\n", "  ctx: 32\n  text_file: t.txt\n"),
     ":13: fidelity needs exactly one of text (inline) or text_file (a text file)"),
    (("  ctx: 32\n", "  ctx: 4\n"), ":14: fidelity.ctx must be >= 8"),
    (("  chunks: 4\n", "  chunks: 4\n  cells: some\n"), ":16: fidelity.cells must be one of lossy, all, got 'some'"),
])
def test_section_problems_name_the_line(tmp_path, change, message):
    (line,) = errors(write(tmp_path, GOOD.replace(*change)))
    assert line.endswith(message) or message in line, line


def test_an_external_engine_is_refused_in_one_line(tmp_path):
    (tmp_path / "cli").write_text("#!/bin/sh\n")
    p = write(tmp_path, GOOD.replace("target: local\n", "target: local\nengine: {kind: external, path: cli}\n"))
    (line,) = [x for x in errors(p) if "fidelity" in x]
    assert "the C++ engine (bmoe-cli) has no logits output" in line and "\n" not in line
    # an external engine declared to be the Python engine (over adb: a script running it on the device) plans
    py = plan_campaign(write(tmp_path, GOOD.replace("target: local\n", "target: local\nengine: {kind: external, "
                                                    "path: cli}\n").replace("  ctx: 32\n", "  ctx: 32\n  "
                                                                             "python_engine: true\n"), "py.yaml"))
    assert py.campaign.fidelity.python_engine


def test_route_ahead_cell_and_harness_flags_are_refused(tmp_path):
    p = write(tmp_path, GOOD.replace("  - {flag: --cache-policy", "  - {flag: --route-ahead, values: [0, 1]}\n"
                                                                  "  - {flag: --cache-policy")
              .replace("--cache-policy: aged-markov}", "--cache-policy: aged-markov, --route-ahead: 0}"))
    assert [x for x in errors(p) if "teacher-forced" in x] == [
        f"{p}:9: cell --route-ahead=1: --route-ahead acts only while decoding one token at a time, so teacher-forced "
        "scoring cannot measure it; move the cell to a campaign without a fidelity section"]
    (line,) = errors(write(tmp_path, GOOD.replace("--cache-mb: 4,", "--cache-mb: 4, --fidelity-top-k: 8,"), "h.yaml"))
    assert "--fidelity-top-k is set by the harness from 'fidelity'" in line


def test_text_file_must_be_readable(tmp_path):
    p = write(tmp_path, GOOD.replace(f'  text: "{TEXT}"\n', "  text_file: nowhere.txt\n"))
    (line,) = errors(p)
    assert f"{p}:13: fidelity.text_file nowhere.txt: cannot read it" in line


@pytest.mark.parametrize("name", ["quality-drop", "quality-k", "fidelity"])
def test_shipped_campaigns_plan_their_scoring(name):
    plan = plan_campaign(REPO / "campaigns" / f"{name}.yaml")
    s = plan_scoring(plan.campaign, plan.cells)
    assert s.problems == () and s.cells
    lossy = {"--n-expert-used=6", "--n-expert-used=4", "--drop-cold-experts=0.5", "--drop-cold-experts=0.75",
             "--drop-cold-experts=1.0"}
    got = set(_labels(plan, s.cells))
    assert got == ({x.label for x in plan.cells} if name == "fidelity" else
                   {x.label for x in plan.cells} & lossy)
