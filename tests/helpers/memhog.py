"""A program of known footprint for the mincap tests (run as a script, never imported): holds --mib MiB of anonymous
memory, every page written, for -n tokens of --ms each, and writes each token's row with the real metrics writer to
--csv, as an engine does. Unknown flags are ignored."""

from __future__ import annotations

import argparse
import mmap
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.formats.metrics_csv import MetricsWriter, TokenRow  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, required=True)
    ap.add_argument("-n", type=int, required=True)
    ap.add_argument("--ms", type=float, default=20.0)
    ap.add_argument("--csv", required=True)
    args, _ = ap.parse_known_args()
    buf = mmap.mmap(-1, args.mib << 20)
    for off in range(0, len(buf), mmap.PAGESIZE):
        buf[off] = 1
    with MetricsWriter(args.csv, {"engine": "memhog", "mib": args.mib}) as w:
        for i in range(args.n):
            t0 = time.perf_counter()
            time.sleep(args.ms / 1e3)
            w.row(TokenRow(step=i + 1, steps=args.n, wall_ms=(time.perf_counter() - t0) * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
