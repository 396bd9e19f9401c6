"""Which cell each cell's ratio is to, from the plan record's cells (pure). The report (harness.report.results)
and the precision rule of the runs (harness.campaigns.precision) both read it, so they agree."""

from __future__ import annotations

from harness.formats.manifest import PlanCell


def base_cells(cells: list[PlanCell]) -> dict[int, int]:
    """Each cell's base, the cell its ratio is to: the plan's base cell (the one varying nothing); in a compare fleet
    (its cells carry their device) the base cell of the cell's own device, so that no ratio is between devices."""
    base = next(c.index for c in cells if not c.varied)
    own = {c.device: c.index for c in cells if c.device is not None and set(c.varied) <= {"device"}}
    return {c.index: own.get(c.device, base) if c.device is not None else base for c in cells}
