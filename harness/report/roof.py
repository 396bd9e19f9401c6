"""The rooflines of one cell (pure): the I/O roofline, measured bandwidth / MiB read per token, and the
combined roofline 1 / max(M / bandwidth, C), C the cell's own compute s/token, which only a cell whose
engine split the token into I/O wait and compute has (an mmap baseline's page faults land in compute)."""

from __future__ import annotations

import math

from harness.report.results import CellResult


def io_roofline(c: CellResult, mib_s: float) -> float | None:
    """tok/s the storage allows the cell's reads, None when it read nothing measurable."""
    if not math.isfinite(c.mib_per_tok) or c.mib_per_tok <= 0 or mib_s <= 0:
        return None
    return mib_s / c.mib_per_tok


def combined_roofline(c: CellResult, mib_s: float) -> float | None:
    """tok/s if reads were wholly hidden behind compute, None where the token was not split."""
    if io_roofline(c, mib_s) is None or not (math.isfinite(c.io_s) and math.isfinite(c.compute_s)):
        return None
    if c.compute_s <= 0:
        return None
    return 1 / max(c.mib_per_tok / mib_s, c.compute_s)
