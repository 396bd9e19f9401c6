"""What a campaign leaves on disk: a complete, self-describing folder whose manifest (typed, bmoe-manifest
v2) records every run, in the planned order, with the sha256 of each raw file as committed."""

import json

from harness.campaigns.runner import run_campaign
from harness.formats.devstate import read_states
from harness.formats.files import sha256_file
from harness.formats.manifest import VERSION, load_manifest, raw_file_changes
from harness.formats.metrics_csv import read_metrics
from harness.formats.outcome import read_outcome
from tests.helpers.runner import campaign, quiet


def test_a_campaign_leaves_a_complete_self_describing_folder(tmp_path):
    res = run_campaign(campaign(tmp_path), root=tmp_path / "bd", console=quiet())
    assert (res.n_ok, res.n_failed, res.n_skipped) == (4, 0, 0)
    folder = res.folder
    assert folder.parent == tmp_path / "bd" and folder.name.endswith("-t")
    assert (folder / "campaign.yaml").read_text() == (tmp_path / "t.yaml").read_text()
    m = load_manifest(folder)
    assert m.format == "bmoe-manifest" and m.version == VERSION and m.status == "complete"
    assert m.engine.version == "fake-engine 1.0"
    assert m.target.kind == "local" and m.harness.commit
    assert [r.run_id for r in m.runs] == ["r01-c00", "r01-c01", "r02-c01", "r02-c00"]
    assert m.campaign.order_of_runs == [r.run_id for r in m.runs]
    starts = [r.start for r in m.runs]
    assert starts == sorted(starts)
    for r in m.runs:
        assert r.status == "ok" and r.reason is None and r.tokens == 6
        d = folder / "runs" / r.run_id
        assert sorted(p.name for p in d.iterdir()) == ["engine.log", "metrics.csv", "outcome.json", "state.jsonl"]
        assert read_metrics(d / "metrics.csv").format == "bmoe_metrics v2"
        assert read_outcome(d / "outcome.json") == r.outcome()
        assert len(read_states(d / "state.jsonl")) == r.n_state_samples
        assert "BMOE_PROGRESS" in (d / "engine.log").read_text()
        assert r.entry_state.mem_available_mib > 0 and r.gate.gave_up is False
        assert r.sha256 == {p.name: sha256_file(p) for p in sorted(d.iterdir())}
    assert m.runs[1].argv[-4:] == ["--speed", "20", "--sleep-ms", "0"]
    assert not list((folder / "runs").glob(".*"))
    assert raw_file_changes(folder, m) == []
    # what is on disk is exactly what the model writes: nothing the schema does not name
    assert json.loads((folder / "manifest.json").read_text()) == m.dump()


def test_a_changed_campaign_starts_a_new_folder(tmp_path):
    p = campaign(tmp_path, repeats=1)
    a = run_campaign(p, root=tmp_path / "bd", console=quiet())
    p.write_text(p.read_text().replace("tokens: 6", "tokens: 5"))
    b = run_campaign(p, root=tmp_path / "bd", console=quiet())
    assert a.folder != b.folder and b.n_skipped == 0
    assert load_manifest(a.folder).plan_hash != load_manifest(b.folder).plan_hash
