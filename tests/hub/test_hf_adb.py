"""A campaign whose model is `hf:` run over adb against the real adbd on loopback (tests/adbd/run-adb-tests.sh runs it
in a private network namespace; elsewhere it skips): pulled from the loopback hub on the host, every shard of the
split model staged on the device, the engine run there, the repo, commit and each shard's sha256 in the manifest."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from harness.campaigns.runner import run_campaign
from tests.helpers.adbd import SERIAL
from tests.helpers.hub import REPO, Hub
from tests.helpers.runner import quiet

pytestmark = [pytest.mark.adb]

# a POSIX sh engine for the device: refuses to run unless the model's three shards sit side by side where -m says
# (llama.cpp finds the others from the first's name), then writes a bmoe_metrics v2 CSV and its progress lines
ENGINE = r"""#!/bin/sh
n=4; csv=""; m=""
while [ $# -gt 0 ]; do
  case "$1" in
    -m) m="$2"; shift 2;;
    -n) n="$2"; shift 2;;
    --csv) csv="$2"; shift 2;;
    --version) echo "sh-engine 1"; exit 0;;
    *) shift;;
  esac
done
base="${m%-00001-of-00003.gguf}"
for i in 1 2 3; do
  [ -f "$base-0000$i-of-00003.gguf" ] || { echo "sh-engine: shard $i of $m is not on the device" >&2; exit 2; }
done
{
  echo "# bmoe_metrics v2"; echo "# engine_version=sh-engine 1"
  echo "step,steps,wall_ms,read_bytes"
  i=0; while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "$i,$n,100,1048576"; done
  echo "# summary tokens=$n"
} > "$csv.part"
mv "$csv.part" "$csv"
i=0
while [ "$i" -lt "$n" ]; do i=$((i + 1)); echo "BMOE_PROGRESS {\"step\": $i, \"steps\": $n, \"wall_ms\": 100}"; done
"""


def test_an_hf_campaign_over_adb_stages_every_shard(hub: Hub, hf_env: Path, tmp_path: Path):
    eng = tmp_path / "sh-engine"
    eng.write_text(ENGINE)
    eng.chmod(0o755)
    p = tmp_path / "hf-adb.yaml"
    p.write_text(textwrap.dedent(f"""\
        name: hf-adb
        model: {{hf: "{REPO}:Q4_K_M"}}
        target: {{kind: adb, serial: "{SERIAL}"}}
        engine: {{kind: external, push_from: {eng}}}
        repeats: 1
        tokens: 4
        cooldown: {{cpu_temp_max_c: 90, mem_available_min_mib: 64, max_wait_s: 5}}
        timeout_s: 60
        axes: [{{flag: --slow, values: [true]}}]
        """))
    res = run_campaign(p, root=tmp_path / "bd", console=quiet())
    m = json.loads((res.folder / "manifest.json").read_text())
    assert [r["status"] for r in m["runs"]] == ["ok", "ok"], [r.get("reason") for r in m["runs"]]
    assert all(r["argv"][r["argv"].index("-m") + 1].startswith("/data/local/tmp/") for r in m["runs"])
    hubsrc = m["provenance"]["hub"]
    assert (hubsrc["repo"], hubsrc["commit"]) == (REPO, hub.repos[REPO].commit)
    shards = [f"tiny-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert hubsrc["files"] == {n: hub.repos[REPO].files[n].sha256 for n in shards}
    assert m["provenance"]["model_sha256"] == hubsrc["files"]  # hashed on the device: the same bytes
