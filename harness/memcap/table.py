"""The tables of a mincap folder, in Markdown, from its records (harness.formats.mincap):

    python -m harness.memcap.table bench-data/<folder>

the minimum cap of each search, and each breakdown's memory by kind beside the cgroup's charge."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.errors import UserError
from harness.formats import mincap as fmt
from harness.memcap.smaps import KINDS


def _cell(v: object) -> str:
    return "n/a" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def searches_table(recs: list[dict]) -> list[str]:
    out = ["| search | roomy tok/s | roomy cgroup peak MiB | minimum cap MiB | fails at MiB | repeats per cap | note |",
           "|---|---|---|---|---|---|---|"]
    for r in recs:
        if r["record"] == "search":
            out.append(f"| {r['label']} | {r['roomy_tok_s']:.2f} | {_cell(r['roomy_peak_mib'])} | "
                       f"{_cell(r['min_cap_mib'])} | {_cell(r['fails_at_mib'])} | {r['repeats']} | {r['note']} |")
    return out


def breakdown_table(recs: list[dict]) -> list[str]:
    bds = [r for r in recs if r["record"] == "breakdown"]
    if not bds:
        return []
    head = "| resident MiB (anonymous) | " + " | ".join(f"{b['label']} @ {b['cap_mib']}" for b in bds) + " |"
    out = [head, "|---|" + "---|" * len(bds)]
    for k in KINDS:
        vals = [b["kinds"].get(k, {}) for b in bds]
        if not any(v.get("count") for v in vals):
            continue
        out.append(f"| {k} | " + " | ".join(f"{_cell(v.get('rss_mib'))} ({_cell(v.get('anon_mib'))})" for v in vals)
                   + " |")
    for key in ("Rss", "Anonymous"):
        out.append(f"| process {key} (smaps_rollup) | " + " | ".join(_cell(b["rollup_mib"].get(key)) for b in bds)
                   + " |")
    for key in ("usage", "anon", "file", "file_mapped", "shmem", "kernel"):
        out.append(f"| cgroup {key} | " + " | ".join(_cell(b["charge_mib"].get(key)) for b in bds) + " |")
    out.append("| cgroup peak | " + " | ".join(_cell(b["peak_mib"]) for b in bds) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("Error: give one folder holding a mincap.jsonl\n")
        return 2
    try:
        recs = fmt.read(Path(args[0]) / fmt.FILE)
    except UserError as e:
        sys.stderr.write(f"Error: {e}\n")
        return e.exit_code
    print("\n".join(searches_table(recs)))
    bd = breakdown_table(recs)
    if bd:
        print()
        print("\n".join(bd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
