"""Is a run in a reclaim storm? A pure verdict over its token rows, for a one-line warning.

A memory cap that is too tight for the cache shows as the kernel reclaiming the dense weights mid-run:
their resident share falls, tokens take major faults, and tasks stall on memory (PSI). The cure is to
move the dense weights out of the page cache (`--dense-weights anon`) or to leave more room (a smaller
`--cache-mb`). Thresholds: a tenth of decode time stalled on memory, or a tenth of the dense weights gone.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.formats.metrics_csv import TokenRow

STALL_SHARE = 0.10  # PSI memory stall / wall time over the decode
DENSE_LOST = 0.10  # 1 - the lowest measured dense_resident_frac


@dataclass
class Pressure:
    """Running totals over a run's token rows (feed each row to `add`)."""

    wall_ms: float = 0.0
    stall_ms: float = 0.0
    stall_rows: int = 0
    majflt: int = 0
    rows: int = 0
    min_dense_frac: float | None = None

    def add(self, r: TokenRow) -> None:
        self.rows += 1
        self.wall_ms += r.wall_ms
        if r.mem_stall_ms >= 0:
            self.stall_ms += r.mem_stall_ms
            self.stall_rows += 1
        if r.majflt > 0:
            self.majflt += r.majflt
        if r.dense_resident_frac >= 0:
            f = r.dense_resident_frac
            self.min_dense_frac = f if self.min_dense_frac is None else min(self.min_dense_frac, f)

    def warning(self, dense_mode: str, streamed: bool) -> str | None:
        """One line naming the symptom and the remedy, or None when the run was not in a storm."""
        if self.rows == 0:
            return None
        share = self.stall_ms / self.wall_ms if self.stall_rows and self.wall_ms > 0 else 0.0
        lost = 1.0 - self.min_dense_frac if self.min_dense_frac is not None else 0.0
        if share < STALL_SHARE and lost < DENSE_LOST:
            return None
        seen = []
        if share >= STALL_SHARE:
            seen.append(f"{share:.0%} of decode time stalled on memory (PSI)")
        if lost >= DENSE_LOST:
            seen.append(f"only {1 - lost:.0%} of the dense weights stayed in memory")
        seen.append(f"{self.majflt / self.rows:.1f} major faults per token")
        if dense_mode != "anon" and streamed:
            fix = "pass --dense-weights anon (the dense weights then cannot be reclaimed), or a smaller --cache-mb"
        elif not streamed:
            fix = "stream the experts (--moe-stream), or give the run more memory"
        else:
            fix = "give a smaller --cache-mb (or --cache-mb auto), or more memory"
        return f"bmoe: warning: reclaim storm: {', '.join(seen)}; {fix}"
