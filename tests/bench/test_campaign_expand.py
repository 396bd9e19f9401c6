"""One-variable-at-a-time expansion, explicit cross products, and run ordering."""

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from harness.campaigns.expand import expand_cells, flags_argv, order_runs
from harness.campaigns.schema import load_campaign
from harness.campaigns.validate import engine_argv_tail, plan_campaign
from harness.campaigns.yamlsrc import CampaignError
from harness.formats.campaign_replicate import planned_rounds

CAMPAIGNS = Path(__file__).resolve().parents[2] / "campaigns"


def camp(tmp_path, body):
    p = tmp_path / "c.yaml"
    p.write_text("name: t\nmodel: {recipe: {n_layer: 2}}\n" + textwrap.dedent(body))
    return load_campaign(p)


def test_one_axis_at_a_time(tmp_path):
    c = camp(tmp_path, """\
        flags: {--moe-stream: true, --cache-mb: 64, --io-threads: 4}
        axes:
          - {flag: --cache-mb, values: [0, 64, 128]}
          - {flag: --io-threads, values: [1, 4]}
        """)
    cells = expand_cells(c)
    assert [x.label for x in cells] == ["base", "--cache-mb=0", "--cache-mb=128", "--io-threads=1"]
    # the base value (64, 4) is the base cell, not a duplicate; each cell differs in exactly one flag
    assert all(len(x.varied) == 1 for x in cells[1:])
    assert cells[2].flags == {"--moe-stream": True, "--cache-mb": 128, "--io-threads": 4}


def test_axis_on_a_flag_absent_from_the_base(tmp_path):
    c = camp(tmp_path, "axes:\n  - {flag: --moe-stream, values: [false, true]}\n")
    cells = expand_cells(c)
    assert [x.label for x in cells] == ["base", "--moe-stream=on"]
    assert flags_argv(cells[0].flags) == [] and flags_argv(cells[1].flags) == ["--moe-stream"]


def test_cross_product_only_when_asked(tmp_path):
    body = """\
        flags: {--moe-stream: true}
        axes:
          - {flag: --cache-mb, values: [0, 64]}
          - {flag: --io-threads, values: [1, 2, 4]}
        """
    assert len(expand_cells(camp(tmp_path, body))) == 1 + 2 + 3
    cells = expand_cells(camp(tmp_path, body + "cross: true\n"))
    assert len(cells) == 1 + 2 * 3  # the base has neither flag, so it is not among the combinations
    assert {tuple(x.varied) for x in cells[1:]} == {("--cache-mb", "--io-threads")}


def test_bundle_axis_varies_several_flags_as_one_thing(tmp_path):
    c = camp(tmp_path, """\
        flags: {-t: 2}
        axes:
          - name: mode
            values:
              mmap: {}
              streamed: {--moe-stream: true, --cache-mb: 64}
          - {flag: -t, values: [1]}
        """)
    cells = expand_cells(c)
    assert [x.label for x in cells] == ["mmap", "streamed", "-t=1"]  # the bundle equal to the base names it
    assert cells[1].varied == {"--moe-stream": True, "--cache-mb": 64}
    assert cells[1].flags == {"-t": 2, "--moe-stream": True, "--cache-mb": 64}


def test_duplicate_explicit_cell_is_an_error(tmp_path):
    c = camp(tmp_path, """\
        flags: {--moe-stream: true}
        axes:
          - {flag: --cache-mb, values: [0, 64]}
        cells:
          - {--cache-mb: 64}
        """)
    with pytest.raises(CampaignError, match=r"c.yaml:7: cell --cache-mb=64 is listed twice \(first at line 5\)"):
        expand_cells(c)


def test_only_a_base_cell_is_an_error(tmp_path):
    c = camp(tmp_path, "flags: {-t: 2}\naxes:\n  - {flag: -t, values: [2]}\n")
    with pytest.raises(CampaignError, match="only the base cell"):
        expand_cells(c)


def test_interleaved_order():
    runs = order_runs(3, 2, "interleaved", 0)
    assert [(r.round, r.cell) for r in runs] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [r.position for r in runs] == list(range(6))
    assert runs[4].run_id == "r02-c01"


def test_alternating_order_reverses_odd_rounds():
    runs = order_runs(3, 3, "alternating", 0)
    assert [r.cell for r in runs] == [0, 1, 2, 2, 1, 0, 0, 1, 2]


def test_random_order_is_seeded_and_complete():
    a = order_runs(5, 4, "random", 7)
    assert [r.cell for r in a] == [r.cell for r in order_runs(5, 4, "random", 7)]
    assert [r.cell for r in a] != [r.cell for r in order_runs(5, 4, "random", 8)]
    assert Counter(r.cell for r in a) == {i: 4 for i in range(5)}
    for rnd in range(4):  # every cell once per round
        assert sorted(r.cell for r in a if r.round == rnd) == list(range(5))
    assert len({r.run_id for r in a}) == 20


def test_engine_argv(tmp_path):
    c = camp(tmp_path, "flags: {-t: 2}\naxes:\n  - {flag: --moe-stream, values: [true]}\ntokens: 5\n")
    cell = expand_cells(c)[1]
    argv = engine_argv_tail(c, cell, model="m.gguf", csv="o.csv", progress=True)
    assert argv == ["-m", "m.gguf", "-p", c.prompt, "-n", "5", "--csv", "o.csv", "--progress", "-t", "2",
                    "--moe-stream"]


def test_external_engine_spells_its_own_flags(tmp_path):
    p = tmp_path / "c.yaml"
    eng = tmp_path / "eng"
    eng.write_text("")
    p.write_text(textwrap.dedent(f"""\
        name: t
        model: {{path: {eng}}}
        engine: {{kind: external, path: {eng}, args: {{tokens: --n-predict, progress: null}}}}
        axes:
          - {{flag: --x, values: [1, 2]}}
        """))
    plan = plan_campaign(p)
    argv = engine_argv_tail(plan.campaign, plan.cells[1], model="m", csv="o.csv", progress=True)
    assert argv[:8] == ["-m", "m", "-p", plan.campaign.prompt, "--n-predict", "32", "--csv", "o.csv"]
    assert "--progress" not in argv and argv[-2:] == ["--x", "1"]


@pytest.mark.parametrize("path", sorted(CAMPAIGNS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_campaign_file_loads_and_expands(path):
    plan = plan_campaign(path, check_files=False)
    assert len(plan.cells) >= 2
    assert len(plan.runs) == len(plan.cells) * planned_rounds(plan.campaign)  # repeats, once per try if replicating
    assert plan.cells[0].is_base and all(x.varied for x in plan.cells[1:])


def test_the_campaign_files_exist():
    names = {p.name for p in CAMPAIGNS.glob("*.yaml")}
    assert {"demo.yaml", "gptoss.yaml", "qwen3-30b.yaml", "gemma4.yaml", "qwen36.yaml"} <= names
