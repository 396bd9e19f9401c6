"""What is pulled runs: `bmoe -hf org/repo` generates with the pulled split model (a real engine process, streamed
from the cache's snapshot where its three shards sit side by side), and a campaign whose model is `hf:` runs locally
with the repo, the commit and every file's sha256 in its manifest's provenance."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from harness.campaigns.runner import run_campaign
from tests.helpers.engine import BMOE
from tests.helpers.hub import REPO, Hub
from tests.helpers.runner import engine, quiet


@pytest.mark.engine
def test_bmoe_hf_runs_the_pulled_model(hub: Hub, hf_env: Path):
    p = subprocess.run([*BMOE, "-hf", REPO, "-p", "hi", "-n", "4", "-t", "2", "--moe-stream", "--cache-mb", "0"],
                       capture_output=True, text=True, errors="replace", env=dict(os.environ), timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"bmoe: {REPO} -> tiny-Q4_K_M-00001-of-00003.gguf and 2 more shard(s)" in p.stderr
    assert "tok/s" in p.stderr or "tokens" in p.stderr
    n = len(hub.log)
    q = subprocess.run([*BMOE, "-hf", f"{REPO}:Q4_K_M", "-p", "hi", "-n", "4", "-t", "2"], capture_output=True,
                       text=True, errors="replace", env=dict(os.environ), timeout=300)
    assert q.returncode == 0 and "already in the cache" in q.stderr, q.stderr
    assert q.stdout == p.stdout  # the same greedy tokens, mmap or streamed
    assert [e.method for e in hub.log[n:]] == ["GET"]  # the listing, once: the re-executed engine pulls nothing


def test_a_campaign_whose_model_is_hf_records_the_commit_and_hashes(hub: Hub, hf_env: Path, tmp_path: Path,
                                                                     repo_dir: Path):
    exe = engine(tmp_path)
    p = tmp_path / "hf.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: hf
        model: {{hf: "{REPO}:Q4_K_M"}}
        engine: {{kind: external, path: {exe}}}
        flags: {{--speed: 10}}
        repeats: 1
        tokens: 4
        warmup_tokens: 1
        cooldown: {{mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes: [{{flag: --speed, values: [20]}}]
        """))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = json.loads((res.folder / "manifest.json").read_text())
    assert [r["status"] for r in m["runs"]] == ["ok", "ok"]
    hubsrc = m["provenance"]["hub"]
    commit = hub.repos[REPO].commit
    shards = [f"tiny-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert (hubsrc["repo"], hubsrc["revision"], hubsrc["commit"]) == (REPO, "main", commit)
    assert hubsrc["files"] == {n: hub.repos[REPO].files[n].sha256 for n in shards}
    assert m["provenance"]["model_sha256"] == hubsrc["files"]  # hashed again on the target: the same files
    assert m["model"]["hf"] == f"{REPO}:Q4_K_M" and m["model"]["bytes"] == sum(
        (repo_dir / n).stat().st_size for n in shards)
