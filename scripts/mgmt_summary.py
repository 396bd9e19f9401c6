"""Medians of scripts/mgmt_side_by_side.sh runs (harness.engine.diag.mgmt_profile JSON): one line per workload,
variant."""

import glob
import json
import re
import statistics as st
import sys
from collections import defaultdict

SUBMITS = ("reader.submit", "reader.submit_many", "reader.submit_speculative")
rows = defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*.json")):
    tag, v, _ = re.match(r".*/(.+)-(before|python|c)-(\d+)\.json", f).groups()
    r = json.load(open(f))
    p = r["pieces"]
    top = {k: x for k, x in p.items() if x["runq_ms"] is not None}  # the pieces mgmt_ns counts
    cpu = sum(x["cpu_ms"] for x in top.values())
    runq = sum(x["runq_ms"] for x in top.values())
    sub = [x for k, x in p.items() if k in ("_submit", "_submit_many")]
    ev = p.get("cache.evict_over_budget", {"wall_ms": 0, "cpu_ms": 0})
    rows[(tag, v)].append((
        r["mgmt_ms_per_token"], cpu, r["mgmt_ms_per_token"] - cpu, runq, r["s_per_token"] * 1e3,
        100 * r["mgmt_share"], sum(x["wall_ms"] for x in sub), sum(x["cpu_ms"] for x in sub),
        sum(x["calls"] for k, x in p.items() if k in SUBMITS), ev["wall_ms"], ev["cpu_ms"]))
print("workload variant runs | mgmt wall | mgmt cpu | off-cpu | of which runq | s/token ms | mgmt % | submit wall"
      " | submit cpu | submits/token | evict wall | evict cpu")
for (tag, v), xs in rows.items():
    med = [st.median(c) for c in zip(*xs, strict=True)]
    print(f"{tag} {v} {len(xs)} | " + " | ".join(f"{x:.1f}" for x in med))
