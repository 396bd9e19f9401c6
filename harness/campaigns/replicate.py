"""The wait between the tries of a replicating campaign (campaign key `replicate:`): before the first run of try k
(k >= 1) starts, `wait_s` seconds from the end of the last finished run of the tries before it. The time comes
from the manifest's records, so a campaign resumed between two tries waits only what is left of it, and one
resumed inside a try goes on at once (that try has begun). The wait shows on the progress display and ends at
Ctrl-C (KeyboardInterrupt) like any other wait of the runner."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

from harness import interrupts
from harness.formats.manifest import Manifest, PlanRecord, RunRecord

STEP_S = 0.5  # how often the wait re-reads the clock and looks for a stop request


def _epoch(iso: str) -> float | None:
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def try_due(m: Manifest, k: int | None) -> float | None:
    """When try `k` may start (epoch seconds), or None: no wait (the campaign does not replicate, k is the first
    try, a run of try k has finished already, or no run of an earlier try has)."""
    rep = m.campaign.replicate
    if rep is None or k is None or k == 0:
        return None
    if any(r.finished and r.try_index == k for r in m.runs):
        return None
    ends = [t for r in m.runs if r.finished and r.try_index is not None and r.try_index < k and r.end
            for t in [_epoch(r.end)] if t is not None]
    return max(ends) + rep.wait_s if ends else None


def wait_for_try(m: Manifest, k: int | None, on_wait: Callable[[str], None], *, say: Callable[[str], None],
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait until try `k` may start (try_due), showing the time left through on_wait and one line through say;
    the seconds waited."""
    due = try_due(m, k)
    if due is None or due <= clock():
        return 0.0
    rep = m.campaign.replicate
    assert rep is not None and k is not None
    t0 = clock()
    say(f"replicate: try {k + 1} of {rep.tries} starts in {due - t0:.0f} s ({rep.wait_s:g} s after the last run of "
        f"try {k}); Ctrl-C stops, the same command resumes")
    while (left := due - clock()) > 0:
        on_wait(f"replicate: try {k + 1}/{rep.tries} starts in {left:.0f} s")
        interrupts.check()
        sleep(min(STEP_S, left))
    return clock() - t0


def by_try(m: Manifest, pending: list[int]) -> list[tuple[int | None, list[int]]]:
    """The pending runs (indices into m.runs, in plan order) grouped by try, first try first: [(None, all of them)]
    when the campaign does not replicate."""
    groups: dict[int | None, list[int]] = {}
    for i in pending:
        groups.setdefault(m.runs[i].try_index, []).append(i)
    return sorted(groups.items(), key=lambda kv: -1 if kv[0] is None else kv[0])


def round_of(r: RunRecord, plan: PlanRecord, rounds: str) -> tuple[int, str]:
    """(its 1-based round, `of what`) for the progress display: within its try when the campaign replicates."""
    rep = plan.replicate
    if rep is None or r.try_index is None:
        return r.round + 1, rounds
    return r.round % plan.repeats + 1, f"{plan.repeats}, try {r.try_index + 1}/{rep.tries}"
