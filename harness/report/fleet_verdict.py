"""The verdict of a compare fleet (the device an axis of the plan), device by device (pure: the report's results in,
Markdown lines out). On each device: its fastest setting against that device's own base cell, with the ratio's
interval paired over rounds as a one-target verdict has it (harness.report.results computes every ratio of a
compare fleet within its device: harness.formats.manifest.base_cells). Devices are compared with each other only
in the Devices section's cross-device table (harness.report.fleet), never here."""

from __future__ import annotations

from harness.report.intervals import fmt
from harness.report.results import CellResult, Results


def _fastest(cells: list[CellResult]) -> tuple[list[CellResult], CellResult | None]:
    ranked = sorted([c for c in cells if c.tok_s is not None], key=lambda c: -c.tok_s.point)
    return ranked, ranked[0] if ranked else None


def device_verdict(device: str, cells: list[CellResult], base: CellResult | None, name: dict[int, str]) -> str:
    """One device's verdict as one paragraph: `cells` its cells, `base` its base cell, `name` a cell's setting
    label (without the device)."""
    ranked, win = _fastest(cells)
    head = f"**On {device}**: "
    if win is None:
        return head + "no run finished successfully."
    of = f"{name[base.index]} on {device}" if base is not None else f"the base on {device}"
    ties = [c for c in ranked[1:] if c.tok_s.overlaps(win.tok_s)]
    if ties:
        out = [f"**no difference detectable** between **{name[win.index]}** ({fmt(win.tok_s)} tok/s) and "
               + ", ".join(f"**{name[c.index]}**" for c in ties) + ": their 95% confidence intervals overlap."]
    else:
        out = [f"**{name[win.index]}** is fastest: {fmt(win.tok_s)} tok/s"
               + (" (95% CI)." if win.tok_s.between_runs else ".")]
    if win is base:
        out.append(f"No setting beats its base ({of}).")
    elif win.ratio is not None and base is not None:
        r = win.ratio
        out.append(f"Against {of} ({fmt(base.tok_s)} tok/s) that is {fmt(r, 2, 'x')} {of}"
                   + (": the ratio's CI includes 1, so no difference from the base is detectable."
                      if r.contains(1.0) else "."))
    slow = ranked[-1]
    if slow is not win and slow.ratio is not None and len(ranked) > 2:
        out.append(f"Slowest: **{name[slow.index]}**, {fmt(slow.ratio, 2, 'x')} {of}.")
    if any(not c.tok_s.between_runs for c in ranked):
        out.append("A cell with one run has no interval between runs: no difference involving it is established.")
    return head + " ".join(out)


def compare_verdict(res: Results, devices: list[str], device_of: dict[int, str], name: dict[int, str]) -> list[str]:
    """A compare fleet's verdict: a paragraph per device (in `devices`' order), then where devices are compared.
    device_of: cell index -> its device; name: cell index -> its setting label."""
    out = []
    for d in devices:
        cells = [c for c in res.cells if device_of.get(c.index) == d]
        base = next((c for c in cells if res.is_base(c)), None)
        out += [device_verdict(d, cells, base, name), ""]
    return out + [f"Each device's verdict is its own settings against its own base; the devices are compared with "
                  f"each other only in the cross-device table of the Devices section ({len(devices)} devices)."]
