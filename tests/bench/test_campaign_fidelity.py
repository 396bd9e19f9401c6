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
from tests.helpers.campaign import FIDELITY_GOOD as GOOD
from tests.helpers.campaign import FIDELITY_TEXT as TEXT
from tests.helpers.campaign import errors, write

REPO = Path(__file__).resolve().parents[2]


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
    # the cell whose drop rule drops something is listed as scored with --drop-in-prefill added (findings say so)
    assert rec.fidelity.drop_in_prefill_added == [drop.index]
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
        "scoring in prompt batches cannot measure it; give the fidelity section decode: true (one token at a time, "
        "as generation)"]
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


def test_fidelity_campaign_end_to_end_on_a_synthetic_model(tmp_path, monkeypatch):
    """Runner -> one bmoe --fidelity-ref per campaign -> bmoe --fidelity-against beside each scored cell's first
    run -> findings (section, plot), overview column, check; a changed reference is named by the check."""
    from harness.campaigns.runner import run_campaign
    from harness.formats.fidelity import read_fidelity_csv, read_ref_header
    from harness.formats.folder import FIDELITY_CSV, FIDELITY_LOG, FIDELITY_REF, FIDELITY_REF_LOG
    from harness.formats.manifest import load_manifest, raw_file_changes, run_dir
    from harness.report.build import check_report, write_report
    from harness.report.overview import KLD_COLUMN, build_overview
    from tests.helpers.runner import quiet

    monkeypatch.setenv("BMOE_MODEL_CACHE", str(tmp_path / "models"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the engine process loads harness from this checkout
    p = write(tmp_path, GOOD.replace("  chunks: 4\n", "  chunks: 4\n  cells: all\n"))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet(), overrides=["repeats=2"])
    assert (res.n_ok, res.n_failed) == (8, 0)
    f = res.folder
    m = load_manifest(f)
    assert m.fidelity_ref is not None and m.fidelity_ref.status == "ok"
    assert set(m.fidelity_ref.sha256) == {FIDELITY_REF, FIDELITY_REF_LOG}
    assert read_ref_header(f / FIDELITY_REF)["ctx"] == 32 and read_ref_header(f / FIDELITY_REF)["n_chunk"] == 4
    labels = [c.label for c in m.campaign.cells]
    kld = {}
    for r in m.runs:
        d = run_dir(f, r.run_id)
        scored = (d / FIDELITY_CSV).is_file()
        assert scored == (r.round == 0)  # the first round only, every cell (cells: all)
        if scored:
            assert {FIDELITY_CSV, FIDELITY_LOG} <= set(r.sha256)
            kld[labels[r.cell]] = read_fidelity_csv(d / FIDELITY_CSV).columns["kld"]
    assert not kld["base"].any() and not kld["--cache-policy=lru"].any()  # lossless: exactly 0
    assert kld["--n-expert-used=2"].mean() > 0 and len(kld["--n-expert-used=2"]) == 4 * (32 - 1 - 16)
    write_report(f)
    assert check_report(f) == []
    text = (f / "findings.md").read_text()
    section = text.split("## Fidelity: what each knob costs per token", 1)[1].split("\n## ", 1)[0]
    assert "95% over chunks" in section and "not independent" in section and "(plots/kld.png)" in section
    (row,) = [x for x in section.splitlines() if x.startswith("| --cache-policy=lru |")]
    assert row.startswith("| --cache-policy=lru | 0 [0, 0] | 0 | 100.00 | 60 (4) |")
    assert (f / "plots" / "kld.png").read_bytes().startswith(b"\x89PNG")
    over = build_overview(tmp_path / "bd", tmp_path / "reports")
    assert KLD_COLUMN in over and over.count(" | 0 [0, 0] | ") == 2
    (f / FIDELITY_REF).write_bytes((f / FIDELITY_REF).read_bytes()[:-4])
    assert raw_file_changes(f, load_manifest(f)) == [FIDELITY_REF]


def test_an_external_engine_that_is_not_the_python_engine_is_refused_before_the_reference(tmp_path, monkeypatch):
    from harness.campaigns.runner import run_campaign
    from harness.errors import UserError
    from harness.formats.manifest import load_manifest
    from tests.helpers.runner import quiet

    monkeypatch.setenv("BMOE_MODEL_CACHE", str(tmp_path / "models"))
    cli = tmp_path / "cli"
    cli.write_text("#!/bin/sh\necho 0.19.0\n")  # what the C++ engine's --version prints
    cli.chmod(0o755)
    p = write(tmp_path, GOOD.replace("target: local\n", "target: local\nengine: {kind: external, path: cli}\n")
              .replace("  ctx: 32\n", "  ctx: 32\n  python_engine: true\n"))
    with pytest.raises(UserError, match=r"fidelity: engine says it is '0.19.0', not the Python engine"):
        run_campaign(p, root=tmp_path / "bd", console=quiet())
    (folder,) = (tmp_path / "bd").iterdir()
    m = load_manifest(folder)
    assert all(r.status == "pending" for r in m.runs) and m.status.startswith("stopped: UserError")  # nothing ran


def test_a_failed_reference_stops_the_campaign_in_one_line_and_is_recorded(tmp_path, monkeypatch):
    from harness.campaigns.runner import run_campaign
    from harness.errors import UserError
    from harness.formats.folder import FIDELITY_REF_LOG
    from harness.formats.manifest import load_manifest
    from tests.helpers.runner import quiet

    monkeypatch.setenv("BMOE_MODEL_CACHE", str(tmp_path / "models"))
    cli = tmp_path / "cli"  # says it is the Python engine, then fails every run
    cli.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "bmoe 0.1.0"; exit 0; }\necho "no logits today" >&2\n'
                   "exit 3\n")
    cli.chmod(0o755)
    p = write(tmp_path, GOOD.replace("target: local\n", "target: local\nengine: {kind: external, path: cli}\n")
              .replace("  ctx: 32\n", "  ctx: 32\n  python_engine: true\n"))
    with pytest.raises(UserError) as ei:
        run_campaign(p, root=tmp_path / "bd", console=quiet())
    msg = str(ei.value)
    assert "fidelity: the reference run failed (engine exited 3" in msg and "\n" not in msg, repr(msg)
    (folder,) = (tmp_path / "bd").iterdir()
    ref = load_manifest(folder).fidelity_ref
    assert ref is not None and ref.status == "failed" and set(ref.sha256) == {FIDELITY_REF_LOG}
    assert "no logits today" in (folder / FIDELITY_REF_LOG).read_text()
