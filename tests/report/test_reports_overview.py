"""reports/README.md across campaign folders (`bmoe-bench report --all`): known answers from hand-made
folders, configuration from the CSV preambles and never from folder names, folders that are not tabled,
and --check on the repository's own bench-data/ and reports/."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from harness.bench_cli import main
from harness.formats.manifest import HarnessDesc, LocalTargetDesc, ModelDesc, RunRecord, save_manifest
from harness.formats.metrics_csv import MetricsWriter, Summary, TokenRow
from harness.report.overview import build_overview
from tests.helpers.folders import manifest, outcome

REPO = Path(__file__).resolve().parents[2]
MODEL = {"arch": "qwen3moe", "n_layer": 4, "n_expert": 16, "n_expert_used_model": 4, "model_bytes": 2_000_000_000}
MMAP = {"mode": "mmap", "cfg.cache_mb": "auto", "cfg.n_expert_used": 0, "cfg.io_threads": 4}


def make_campaign(root: Path, name: str, cells: list[dict], *, repeats: int = 2, created: str,
                  cap: int | None = 1024, model: dict = MODEL) -> Path:
    """cells: {"label", "preamble", "wall_ms" (per token), "read_mib", "hit", "fail"}; every cell runs
    `repeats` times, the first token of each run is warm-up."""
    folder = root / name
    recs = []
    for rnd in range(repeats):
        for ci, c in enumerate(cells):
            rid = f"r{rnd + 1:02d}-c{ci:02d}"
            rec = {"run_id": rid, "round": rnd, "cell": ci, "position": len(recs), "status": "ok", "reason": None,
                   "tokens": 1 + len(c.get("wall_ms", []))}
            if c.get("fail"):
                rec.update(status="failed", reason="engine exited 3: boom")
                (folder / "runs" / rid).mkdir(parents=True)
            else:
                walls = [999.0, *c["wall_ms"]]
                with MetricsWriter(folder / "runs" / rid / "metrics.csv", {**model, **c["preamble"]}) as w:
                    for i, ms in enumerate(walls, 1):
                        w.row(TokenRow(step=i, steps=len(walls), wall_ms=ms, read_bytes=int(c["read_mib"] * 2**20),
                                       cache_hit_pct=c.get("hit", -1)))
                    w.summary(Summary(n_decode=len(walls), decode_s=sum(walls) / 1000))
            recs.append(rec)
    runs = [RunRecord(run_id=r["run_id"], round=r["round"], cell=r["cell"], position=r["position"],
                      **outcome(r["status"], reason=r["reason"], tokens=r["tokens"]).model_dump())
            for r in recs]
    m = manifest(name, status="complete", runs=runs, repeats=repeats,
                 cells=[(c["label"], {} if i == 0 else {"x": i}) for i, c in enumerate(cells)])
    m = m.model_copy(update={
        "created": created, "reproduce": f"bmoe-bench run campaigns/{name}.yaml",
        "harness": HarnessDesc(bmoe_bench="0.1.0", commit="0123456789abcdef", dirty=False),
        "model": ModelDesc(recipe={"shape": "tiny"}, bytes=model["model_bytes"]),
        "target": LocalTargetDesc(kind="local", cpus=2, cpu_model="Test CPU", mem_cap_mib=cap)})
    save_manifest(folder, m)
    return folder


def bench(tmp_path: Path) -> Path:
    root = tmp_path / "bench-data"
    # the folder's name says the opposite of its preambles: the table must follow the preambles
    make_campaign(root, "2026-01-02-stream-cache9999-k8", [
        {"label": "mmap", "preamble": MMAP, "wall_ms": [100.0] * 4, "read_mib": 10.0},
        {"label": "streamed", "preamble": {"mode": "stream", "cfg.cache_mb": 256, "cfg.n_expert_used": 2,
                                           "cfg.io_threads": 2, "cfg.cache_policy": "lru"},
         "wall_ms": [50.0] * 4, "read_mib": 5.0, "hit": 75.0},
    ], created="2026-01-02T00:00:00.000Z")
    make_campaign(root, "2026-01-01-other", [
        {"label": "off", "preamble": {"mode": "stream", "cfg.cache_mb": 0, "cfg.n_expert_used": 0,
                                      "cfg.io_threads": 8, "cfg.route_replay": "/x/y/qwen.route.csv"},
         "wall_ms": [200.0, 250.0, 200.0, 250.0], "read_mib": 1234.4},
    ], repeats=1, created="2026-01-01T00:00:00.000Z", cap=None, model={**MODEL, "n_expert": 32})
    make_campaign(root, "2026-01-03-broken", [{"label": "base", "fail": True}], created="2026-01-03T00:00:00.000Z")
    (root / "2026-01-04-replay").mkdir()
    (root / "2026-01-04-replay" / "replay.csv").write_text(
        "trace,policy,budget_mib,hit_pct,mib_per_token\nqwen,lru,200,0.000,784.688\nqwen,lfu,200,13.346,674.780\n")
    (root / "notes").mkdir()
    return root


def test_one_table_per_model_with_known_answers(tmp_path):
    text = build_overview(bench(tmp_path), tmp_path / "reports")
    lines = text.splitlines()
    big = "## qwen3moe, 4 layers, 16 experts, top-4: 2.0 GB (synthetic, make-model recipe shape=tiny)"
    small = "## qwen3moe, 4 layers, 32 experts, top-4: 2.0 GB (synthetic, make-model recipe shape=tiny)"
    assert lines.index(small) < lines.index(big)  # by the manifests' creation time
    link = "[2026-01-02-stream-cache9999-k8](../bench-data/2026-01-02-stream-cache9999-k8/findings.md)"
    i = lines.index(big)
    assert lines[i + 2] == ("| Setup | Active experts | Cache | Lanes | tok/s [95% CI] | Flash/token | Cache hit "
                            "| Folder |")
    # warm-up token dropped: 4 x 100 ms = 10 tok/s in both runs; 50 ms = 20 tok/s
    assert lines[i + 4] == (f"| mmap baseline, RAM cap 1024 MiB | 4 | n/a | n/a | 10.0 [10.0, 10.0] | 10.0 MiB | n/a "
                            f"| {link} |")
    assert lines[i + 5] == (f"| streamed, lru, RAM cap 1024 MiB | 2 | 256 MiB | 2 | 20.0 [20.0, 20.0] | 5.00 MiB "
                            f"| 75% | {link} |")
    assert lines[i + 7].startswith("- `2026-01-02-stream-cache9999-k8`: 2 cells x 2 runs of 5 tokens (first 1 "
                                   "dropped as warm-up), on this machine (2 CPUs, Test CPU) under a 1024 MiB memory "
                                   "cap; harness commit `0123456789ab`")
    row = lines[lines.index(small) + 4]
    assert row == ("| streamed, routing replayed from qwen.route.csv | 4 | off | 8 | 4.44 (1 run: spread between runs "
                   "unknown) | 1234 MiB | n/a "
                   "| [2026-01-01-other](../bench-data/2026-01-01-other/findings.md) |")


def test_folders_that_are_not_tabled_are_listed_with_the_reason(tmp_path):
    text = build_overview(bench(tmp_path), tmp_path / "reports")
    tail = text.split("## Not in the tables\n\n", 1)[1].splitlines()
    assert tail == [
        "- [`2026-01-03-broken`](../bench-data/2026-01-03-broken/findings.md): no run finished successfully",
        "- [`2026-01-04-replay`](../bench-data/2026-01-04-replay/findings.md): a cache-replay study, not a campaign "
        "(no manifest.json, no engine runs): cache policies replayed on recorded routing traces (qwen: 2 policies x "
        "1 budgets); its replay.csv has hit % and MiB/token, not tok/s",
        "- [`notes`](../bench-data/notes/findings.md): no manifest.json: not a campaign folder",
    ]
    assert "broken" not in text.split("## Not in the tables")[0]


def test_cli_writes_and_checks_naming_the_file(tmp_path, capsys):
    root = bench(tmp_path)
    report = tmp_path / "reports" / "README.md"
    assert main(["report", "--all", "--check", str(root)]) == 2
    assert capsys.readouterr().err.strip() == (f"Error: {report} is missing; run `bmoe-bench report --all` and "
                                               f"commit the result")
    assert main(["report", "--all", str(root)]) == 0
    assert report.read_text() == build_overview(root, report.parent)
    assert main(["report", "--all", "--check", str(root)]) == 0
    capsys.readouterr()
    report.write_text(report.read_text().replace("20.0 [20.0, 20.0]", "21.0 [20.0, 22.0]"))
    assert main(["report", "--all", "--check", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"Error: {report} differs from what {root} gives; run `bmoe-bench report --all` and commit "
                   f"the result"]
    assert main(["report", "--all", str(tmp_path / "nope")]) == 2
    assert "nope: no such folder" in capsys.readouterr().err
    assert main(["report"]) == 2
    assert "name a campaign folder" in capsys.readouterr().err


def test_the_committed_reports_match_the_committed_bench_data(capsys, tmp_path):
    """Against the committed folders only: a campaign the user has run here since (scripts/demo.sh writes
    bench-data/<today>-demo) is theirs, not the repository's."""
    tracked = subprocess.run(["git", "ls-files", "--", "bench-data", "reports"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split()
    assert "reports/README.md" in tracked
    for rel in tracked:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, tmp_path / rel)
    assert main(["report", "--all", "--check", str(tmp_path / "bench-data")]) == 0, capsys.readouterr().err


def test_a_row_says_what_recycling_did_not_what_was_asked():
    """auto became the default: rows are labelled by the kind that took effect, and runs from before auto (off the
    default then, or no flag yet) and mmap runs count as off, so old tables gain no label."""
    from harness.report.overview import recycled

    assert recycled({"cfg.recycle_pages": "auto", "recycle_pages_effective": "move (auto)"}, True) == "move"
    assert recycled({"cfg.recycle_pages": "auto", "recycle_pages_effective": "off (auto: no expert cache; ...)"},
                    True) == "off"
    assert recycled({"cfg.recycle_pages": "memfd"}, True) == "memfd"
    assert recycled({"cfg.recycle_pages": "off"}, True) == recycled({}, True) == "off"
    assert recycled({"cfg.recycle_pages": "auto", "recycle_pages_effective": "move (auto)"}, False) == "off"
