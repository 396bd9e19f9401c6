"""Run one command under a cgroup memory cap and report the cgroup's peak memory.

    python -m harness.targets.capped --mem-mib 2048 [--drop-caches] [--json OUT.json] -- CMD [ARGS...]

stdin/stdout/stderr pass through. At the end one line goes to stderr:
    BMOE_CAPPED {"mem_cap_mib": 2048, "peak_mib": 1987.4, "oom_killed": false, "exit_code": 0, "wall_s": 12.3}
(peak includes page cache charged to the cgroup: memory.max_usage_in_bytes on v1, memory.peak on v2). A command the
kernel's OOM killer ended (it cannot say so itself: SIGKILL) gets a line of its own before that one, and the record's
`oom_reason`.
Exit status: the command's; 128+N if killed by signal N (137 for an OOM kill).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time

from harness.errors import UserError
from harness.targets.cgroup import CappedCgroup, locate_self
from harness.targets.local import drop_page_cache, oom_reason


def run_capped(cmd: list[str], mem_mib: int, drop_caches: bool = False) -> dict:
    """Run cmd inside a fresh capped cgroup child (removed afterwards); return the record."""
    if drop_caches and not drop_page_cache():
        raise UserError("--drop-caches: could not drop the page cache (needs root)")
    with CappedCgroup(locate_self(), mem_mib) as cg:
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(cg.wrap_argv(cmd))
        except OSError as e:
            raise UserError(f"cannot start {cmd[0]}: {e.strerror}") from e
        try:
            rc = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            rc = proc.wait()
        wall = time.monotonic() - t0
        peak = cg.peak_bytes()
        return {
            "mem_cap_mib": mem_mib,
            "peak_mib": round(peak / 2**20, 1) if peak is not None else None,
            "oom_killed": cg.oom_kills() > 0,
            "oom_reason": oom_reason(mem_mib, cg.oom_file, cg.oom_kills()) if cg.oom_kills() else None,
            "exit_code": rc if rc >= 0 else None,
            "signal": -rc if rc < 0 else None,
            "wall_s": round(wall, 3),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.targets.capped", description=__doc__.split("\n")[0])
    ap.add_argument("--mem-mib", type=int, required=True, help="memory cap in MiB (page cache included)")
    ap.add_argument("--drop-caches", action="store_true", help="drop the page cache first (root)")
    ap.add_argument("--json", metavar="PATH", help="also write the record to this file")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    try:
        if not cmd:
            raise UserError("no command given: use -- CMD [ARGS...]")
        rec = run_capped(cmd, args.mem_mib, args.drop_caches)
    except UserError as e:
        sys.stderr.write(f"Error: {e}\n")
        return e.exit_code
    line = json.dumps(rec)
    if rec["oom_reason"]:  # the command cannot say it: the kernel killed it with SIGKILL
        sys.stderr.write(f"capped: {cmd[0]} was {rec['oom_reason']}\n")
    sys.stderr.write(f"BMOE_CAPPED {line}\n")
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return rec["exit_code"] if rec["exit_code"] is not None else 128 + rec["signal"]


if __name__ == "__main__":
    sys.exit(main())
