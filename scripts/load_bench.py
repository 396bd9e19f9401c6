"""Load cost with and without llama.cpp's populating load, side by side, from a cold page cache.

For each round, for each mode (the plain mmap run, and streamed with no cache), runs `bmoe` once with
`--load-populate on` (llama.cpp's MAP_POPULATE load) and once with `off` (the mmap shim), in alternating order
(reversed on odd rounds), after dropping the model file's pages from the page cache (posix_fadvise
DONTNEED). Writes one CSV row per run with what the engine measured: bytes this process read from storage
across `llama_model_load_from_file` (/proc/self/io read_bytes), its wall time, the same for the prefill
(where the unpopulated load's dense pages are first read), TTFT, decode tok/s, and a digest of the
generated token ids (which must not depend on the load).

    PYTHONPATH=. python scripts/load_bench.py -m MODEL.gguf --rounds 3 --out bench-data/DIR/load.csv
    PYTHONPATH=. python scripts/load_bench.py --table bench-data/DIR/*.csv     (the findings' table)
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness.campaigns.pagecache import evict_model_files
from harness.engine.io.sysstats import host_description
from harness.formats.metrics_csv import read_metrics

MODES = {"mmap": [], "stream": ["--moe-stream", "--cache-mb", "0"]}
COLUMNS = ["round", "position", "mode", "load_populate", "load_read_bytes", "load_model_ms", "load_ms",
           "prefill_io_read_mib", "ttft_ms", "decode_tok_s", "tokens_sha", "model_bytes", "dense_bytes", "note"]


def one_run(model: Path, mode: str, populate: bool, n: int, threads: int, tmp: Path) -> dict[str, object]:
    evict_model_files(model)
    out = tmp / "run.csv"
    argv = [sys.executable, "-m", "harness.engine.cli", "-m", str(model), "-n", str(n), "-t", str(threads),
            "--csv", str(out), *MODES[mode], "--load-populate", "on" if populate else "off"]
    p = subprocess.run(argv, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"load_bench: {' '.join(argv)} exited {p.returncode}: {p.stderr.strip()[-400:]}")
    m = read_metrics(out)
    s, pre = m.summary(), m.meta
    return {"mode": mode, "load_populate": pre["load_populate"], "load_read_bytes": pre["load_read_bytes"],
            "load_model_ms": pre["load_model_ms"], "load_ms": s["load_ms"],
            "prefill_io_read_mib": s["prefill_io_read_mib"], "ttft_ms": s["ttft_ms"],
            "decode_tok_s": s["decode_tok_s"],
            "tokens_sha": hashlib.sha256(",".join(map(str, m.token_ids())).encode()).hexdigest()[:16],
            "model_bytes": pre["model_bytes"], "dense_bytes": pre["dense_bytes"],
            "note": pre["load_populate_note"]}


def table(paths: list[Path]) -> str:
    """Medians per model, mode and load, as a markdown table (min-max in brackets)."""
    import statistics

    out = ["| model (file GiB, dense MiB) | mode | load | runs | read at load MiB | load ms | read in prefill MiB "
           "| load + TTFT ms | decode tok/s | same tokens |",
           "|---|---|---|---|---|---|---|---|---|---|"]

    def cell(xs: list[float], nd: int = 0) -> str:
        return f"{statistics.median(xs):.{nd}f} [{min(xs):.{nd}f}-{max(xs):.{nd}f}]"

    for p in paths:
        with open(p) as f:
            rows = list(csv.DictReader(x for x in f if not x.startswith("#")))
        model = p.stem.removeprefix("load-")
        for mode in dict.fromkeys(r["mode"] for r in rows):
            sel = [r for r in rows if r["mode"] == mode]
            same = "yes" if len({r["tokens_sha"] for r in sel}) == 1 else "NO"
            for pop in ("1", "0"):
                rs = [r for r in sel if r["load_populate"] == pop]
                if not rs:
                    continue
                size, dense = int(rs[0]["model_bytes"]) / 2**30, int(rs[0]["dense_bytes"]) / 2**20
                out.append(f"| {model} ({size:.1f}, {dense:.0f}) | {mode} | "
                           f"{'populate' if pop == '1' else 'shim'} | {len(rs)} | "
                           f"{cell([int(r['load_read_bytes']) / 2**20 for r in rs], 1)} | "
                           f"{cell([float(r['load_model_ms']) for r in rs])} | "
                           f"{cell([float(r['prefill_io_read_mib']) for r in rs])} | "
                           f"{cell([float(r['load_ms']) + float(r['ttft_ms']) for r in rs])} | "
                           f"{cell([float(r['decode_tok_s']) for r in rs], 2)} | {same} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--table", nargs="+", type=Path, metavar="CSV", help="print the findings' table and exit")
    ap.add_argument("-m", "--model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=8, help="tokens to generate per run")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--modes", default="mmap,stream", help="comma-separated: " + ",".join(MODES))
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    if a.table:
        print(table(a.table))
        return 0
    if a.model is None or a.out is None:
        ap.error("-m/--model and --out are required (or --table CSV...)")
    modes = a.modes.split(",")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="load-bench-") as d:
        for r in range(a.rounds):
            for mode in modes:
                order = [False, True] if r % 2 == 0 else [True, False]
                for pos, populate in enumerate(order):
                    row = {"round": r, "position": pos, **one_run(a.model, mode, populate, a.n, a.threads, Path(d))}
                    rows.append(row)
                    print(" ".join(f"{k}={row[k]}" for k in COLUMNS[:10]), flush=True)
    with open(a.out, "w", newline="") as f:
        f.write("# load_bench v1\n")
        f.write(f"# command=PYTHONPATH=. python scripts/load_bench.py {' '.join(argv or sys.argv[1:])}\n")
        date = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        f.write(f"# model={a.model.name} host={host_description()} date={date}\n")
        f.write("# cold start: posix_fadvise DONTNEED on the model file before every run; "
                "bytes are /proc/self/io read_bytes of the engine process\n")
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {a.out} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
