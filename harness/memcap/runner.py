"""`bmoe-bench mincap` and `bmoe-bench footprint` as functions: the roomy run, the bisection over real capped runs
(harness.memcap.search), and the breakdown run; every run stored as it ends (harness.formats.mincap)."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.formats import mincap as fmt
from harness.memcap.probe import MIB, Watched, option_value, run_capped, tokens_asked
from harness.memcap.search import Criterion, bisect

Say = Callable[[str], None]


@dataclass(frozen=True)
class Plan:
    label: str
    argv: list[str]
    out: Path
    resolution: int = 8
    slowdown: float = 2.0
    repeats: int = 1
    warmup: int = 2
    roomy_mib: int = 4096
    lo: int = 64
    hi: int | None = None  # None: the roomy run's peak, rounded up
    timeout_s: float | None = None  # None: 3 x slowdown x the roomy run's wall time, at least 60 s
    interval_s: float = 0.1

    def evict(self) -> list[Path]:
        m = option_value(self.argv, "-m", "--model")
        return [Path(m)] if m else []


def _mib(b: int | None) -> float | None:
    return round(b / MIB, 1) if b is not None else None


def _probe_fields(p: Plan, cap: int, repeat: int, w: Watched, reason: str | None) -> dict:
    return {"label": p.label, "cap_mib": cap, "repeat": repeat, "runs": reason is None, "reason": reason,
            "exit_code": w.facts.exit_code, "oom_kills": w.facts.oom_kills, "timed_out": w.facts.timed_out,
            "wall_s": round(w.wall_s, 3), "tokens": w.facts.tokens,
            "tok_s": round(w.facts.tok_s, 4) if w.facts.tok_s is not None else None, "peak_mib": w.peak_mib,
            "anon_mib": _mib(w.charge.get("anon")), "file_mib": _mib(w.charge.get("file")),
            "kernel_mib": _mib(w.charge.get("kernel"))}


def host() -> str:
    return f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}"


def find_min_cap(p: Plan, say: Say) -> dict:
    """The roomy runs, then the bisection; returns the stored `search` record."""
    tokens = tokens_asked(p.argv)
    for name, v in (("--resolution", p.resolution), ("--repeats", p.repeats), ("--roomy", p.roomy_mib)):
        if v < 1:
            raise UserError(f"mincap: {name} {v} must be at least 1")
    if p.slowdown <= 1:
        raise UserError(f"mincap: --slowdown {p.slowdown:g} must be above 1 (a run is allowed that much slower "
                        "than its roomy speed)")
    roomy = Criterion(tokens)
    speeds, peaks, walls = [], [], []
    for r in range(p.repeats):
        w = run_capped(p.argv, p.roomy_mib, timeout_s=p.timeout_s or 600, warmup=p.warmup, evict=p.evict(),
                       interval_s=p.interval_s)
        why = roomy.verdict(w.facts)
        fmt.append(p.out, "probe", _probe_fields(p, p.roomy_mib, r, w, why))
        if why is not None or w.facts.tok_s is None:
            why = why or "no decode speed"
            raise UserError(f"mincap {p.label}: the roomy run under {p.roomy_mib} MiB did not run ({why}); fix the "
                            "command or raise --roomy")
        speeds.append(w.facts.tok_s)
        peaks.append(w.peak_mib or 0.0)
        walls.append(w.wall_s)
        say(f"{p.label}: roomy {p.roomy_mib} MiB: {w.facts.tok_s:.2f} tok/s, cgroup peak {w.peak_mib} MiB")
    crit = Criterion(tokens, statistics.median(speeds), p.slowdown)
    timeout = p.timeout_s or max(60.0, 3 * p.slowdown * max(walls))
    hi = p.hi if p.hi is not None else int(max(peaks)) + p.resolution
    seen: dict[int, int] = {}

    def probe(cap: int) -> bool:
        for r in range(p.repeats):
            w = run_capped(p.argv, cap, timeout_s=timeout, warmup=p.warmup, evict=p.evict(), interval_s=p.interval_s)
            why = crit.verdict(w.facts)
            fmt.append(p.out, "probe", _probe_fields(p, cap, seen.get(cap, 0) + r, w, why))
            tok = f"{w.facts.tok_s:.2f} tok/s" if w.facts.tok_s is not None else "no tok/s"
            say(f"{p.label}: {cap} MiB: {'runs' if why is None else 'fails: ' + why} ({tok}, cgroup peak "
                f"{w.peak_mib} MiB)")
            if why is not None:
                return False
        seen[cap] = seen.get(cap, 0) + p.repeats
        return True

    s = bisect(probe, p.lo, hi, p.resolution)
    fails = max((c for c, ok in s.runs.items() if not ok and (s.min_cap is None or c < s.min_cap)), default=None)
    rec = {"label": p.label, "argv": p.argv, "resolution_mib": p.resolution, "slowdown": p.slowdown,
           "repeats": p.repeats, "warmup": p.warmup, "roomy_cap_mib": p.roomy_mib,
           "roomy_tok_s": round(crit.roomy_tok_s or 0, 4), "roomy_peak_mib": max(peaks), "min_cap_mib": s.min_cap,
           "fails_at_mib": fails, "note": s.note, "host": host()}
    fmt.append(p.out, "search", rec)
    say(f"{p.label}: minimum cap {s.min_cap} MiB ({s.note})")
    return rec


def footprint(p: Plan, cap: int, say: Say) -> dict:
    """One run at `cap` with its mappings sampled; returns the stored `breakdown` record."""
    tokens_asked(p.argv)
    w = run_capped(p.argv, cap, timeout_s=p.timeout_s or 600, warmup=p.warmup, evict=p.evict(), maps=True,
                   interval_s=p.interval_s)
    why = Criterion(tokens_asked(p.argv)).verdict(w.facts)
    fmt.append(p.out, "probe", _probe_fields(p, cap, 0, w, why))
    kinds = {k: {"rss_mib": _mib(t.rss), "anon_mib": _mib(t.anon), "size_mib": _mib(t.size), "count": t.count}
             for k, t in w.kinds.items()}
    rec = {"label": p.label, "cap_mib": cap, "argv": p.argv, "kinds": kinds,
           "rollup_mib": {k: _mib(v) for k, v in w.rollup.items()},
           "charge_mib": {k: _mib(v) for k, v in w.charge.items()}, "peak_mib": w.peak_mib,
           "engine_lines": w.lines}
    fmt.append(p.out, "breakdown", rec)
    say(f"{p.label}: {cap} MiB: {'ran' if why is None else 'did not run: ' + why}; cgroup peak {w.peak_mib} MiB")
    for k, v in kinds.items():
        if v["count"]:
            say(f"  {k:<28} rss {v['rss_mib']:>7} MiB  anon {v['anon_mib']:>7} MiB  ({v['count']} mappings)")
    say("  cgroup at its highest sample: " + ", ".join(f"{k} {v} MiB" for k, v in rec["charge_mib"].items()))
    return rec
