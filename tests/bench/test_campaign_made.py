"""`bmoe-bench validate` on a fresh clone (harness.campaigns.made): a file a script or the trained-model recipe
makes is named with its maker, one line each, not refused; a file the user was meant to give still is."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.campaigns.made import plan_template
from harness.campaigns.validate import plan_campaign
from harness.campaigns.yamlsrc import CampaignError

REPO = Path(__file__).resolve().parents[2]
CAMPAIGNS = REPO / "campaigns"
BENCH = [sys.executable, "-m", "harness.bench_cli"]


@pytest.mark.parametrize("path", sorted(CAMPAIGNS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_campaign_validates(path):
    plan, made = plan_template(path)
    assert plan.cells
    for m in made:
        assert not plan.campaign.resolve_local(m.path).exists() and m.maker


def test_fleet_loopback_names_the_script_that_makes_its_files():
    r = subprocess.run([*BENCH, "validate", "campaigns/fleet-loopback.yaml"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    made = [ln for ln in r.stdout.splitlines() if ln.startswith("  made: ")]
    if (REPO / "campaigns" / "model.gguf").exists():  # pragma: no cover: someone made them by hand
        pytest.skip("campaigns/model.gguf exists here")
    assert made == [
        "  made: campaigns/fleet-loopback.yaml:12: model.push_from model.gguf is made by `scripts/fleet-loopback.sh` "
        "(it runs this campaign with --set model.push_from=...); not there yet: checked when it is, and `run` needs it",
        "  made: campaigns/fleet-loopback.yaml:13: engine.push_from bmoe-py is made by `scripts/fleet-loopback.sh` "
        "(it runs this campaign with --set engine.push_from=...); not there yet: checked when it is, and `run` "
        "needs it"]


def _bench_like(tmp_path: Path, model: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: t
        model: {{path: {model}}}
        flags: {{--moe-stream: true}}
        axes:
          - {{flag: --cache-mb, values: [0, 32]}}
        """))
    return p


def test_the_recipe_output_is_made_by_train_model(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    p = _bench_like(tmp_path, str(tmp_path / "cache" / "bmoe" / "recipe" / "bench" / "out" / "m.gguf"))
    with pytest.raises(CampaignError, match="does not exist"):
        plan_campaign(p)  # run's check is unchanged
    _, made = plan_template(p)
    assert [(m.key, m.maker) for m in made] == [("model.path", "scripts/train-model.sh bench")]


def test_a_file_the_user_gives_is_still_a_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for model in (str(tmp_path / "mine.gguf"),  # no maker at all
                  str(tmp_path / "cache" / "bmoe" / "recipe" / "nosuchsize" / "out" / "m.gguf"),  # no such size
                  str(tmp_path / "cache" / "bmoe" / "recipe" / "bench" / "work" / "m.gguf")):  # not its output
        with pytest.raises(CampaignError, match="does not exist"):
            plan_template(_bench_like(tmp_path, model))


def test_a_made_file_does_not_hide_another_problem(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    p = _bench_like(tmp_path, str(tmp_path / "cache" / "bmoe" / "recipe" / "bench" / "out" / "m.gguf"))
    p.write_text(p.read_text() + "engine: {kind: external, push_from: gone-engine}\n")
    with pytest.raises(CampaignError) as e:
        plan_template(p)
    assert [ln for ln in e.value.lines if "does not exist" in ln] == [
        f"{p}:6: engine.push_from gone-engine does not exist"]
