"""findings.md's part for a campaign whose runs ran on several devices (pure: CampaignData and Results in,
Markdown lines out), told from each run's `device` alone (harness.formats.manifest), whatever ran them: a fleet
campaign, or shards merged from several machines. Nothing for a campaign on one target.

- compare (every cell's runs on one device: the device is an axis of the plan): the verdict device by device
  (harness.report.fleet_verdict), a table per device, each setting's tok/s and its ratio to the base setting on
  that device; and one cross-device table, each setting on each device against the same setting on the reference
  device (the base cell's): the only ratios between devices. A setting is a cell's engine and flags.
- spread (a cell's runs on several devices): whether the device explains the variance of tok/s within cells
  (harness.report.fleet_stats, its p-value shown); when it does (p < 0.05) pooling is refused: the verdict says
  so and why, and the per-device figures stand instead of the pooled ones.

Every interval is the report's own (harness.stats, calibrated: t over runs on the log scale; a ratio paired over
rounds where two rounds or more have both, else Welch t); in a campaign that stopped once precise, at 99%."""

from __future__ import annotations

import json
from dataclasses import dataclass

from harness import stats
from harness.report.collect import CampaignData, RunData
from harness.report.fleet_stats import ALPHA, DeviceTest, device_test, p_is, p_text
from harness.report.fleet_verdict import compare_verdict
from harness.report.intervals import fmt
from harness.report.results import Results

COMPARE = "compare"
SPREAD = "spread"


@dataclass(frozen=True)
class Fleet:
    use: str  # COMPARE | SPREAD
    devices: list[str]  # in order of first use, the base cell's device first (the reference)
    test: DeviceTest | None = None  # spread: do the devices differ


def _devices_of(data: CampaignData) -> dict[int, list[str]]:
    """Cell index -> the devices its finished runs ran on, in order of first use."""
    out: dict[int, list[str]] = {c.index: [] for c in data.cells}
    for r in sorted(data.runs, key=lambda r: r.rec.position):
        d = r.rec.device
        if r.rec.finished and d is not None and d not in out[r.rec.cell]:
            out[r.rec.cell].append(d)
    return out


def fleet_of(data: CampaignData, res: Results) -> Fleet | None:
    """The campaign's use of its devices, None when its runs ran on fewer than two."""
    per = _devices_of(data)
    order: list[str] = []
    for idx in [res.base.index] + [c.index for c in data.cells if c.index != res.base.index]:
        order += [d for d in per[idx] if d not in order]
    if len(order) < 2:
        return None
    if all(len(v) <= 1 for v in per.values()):
        return Fleet(COMPARE, order)
    groups = {c.label: {d: _rates([r for r in data.cell_runs(c.index) if r.rec.device == d], data.warmup)
                        for d in per[c.index]} for c in data.cells}
    return Fleet(SPREAD, order, device_test(groups))


def _ok(runs: list[RunData]) -> list[RunData]:
    return [r for r in runs if r.ok]


def _rates(runs: list[RunData], warmup: int) -> list[float]:
    rates = [stats.tok_s(r.metrics.wall_ms(warmup)) for r in _ok(runs)]
    return [x for x in rates if x > 0]  # NaN (no token after the warm-up) is no rate


def _cell_runs(runs: list[RunData], warmup: int) -> stats.CellRuns:
    ok = _ok(runs)
    return stats.CellRuns.of([r.metrics.wall_ms(warmup) for r in ok], [r.rec.round for r in ok])


def _printed(iv: stats.Interval | None, res: Results) -> stats.Interval | None:
    return stats.printed(iv, res.precision.decision if res.precision is not None else None)


def _described(data: CampaignData, fl: Fleet) -> list[str]:
    known = data.manifest.devices or {}
    out = []
    for d in fl.devices:
        desc = ", ".join(f"{k}={v}" for k, v in known.get(d, {}).items()
                         if v is not None and not isinstance(v, dict | list))
        out.append(f"- **{d}**" + (f": {desc}" if desc else ""))
    return out


def _setting(data: CampaignData, index: int) -> tuple[str, str]:
    """(key, label) of a cell's setting: its engine and flags; its label without the device's name."""
    c = data.cells[index]
    key = json.dumps([c.engine, sorted((k, v) for k, v in c.flags.items() if k != "device")], default=str)
    devs = {r.rec.device for r in data.cell_runs(index) if r.rec.device}
    words = [w for w in c.label.split(" ") if w not in devs and not any(w == f"device={d}" for d in devs)]
    return key, " ".join(words) or "base"


def _compare(data: CampaignData, res: Results, fl: Fleet) -> list[str]:
    per = _devices_of(data)
    seed, w = data.plan.seed, data.warmup
    grid: dict[str, dict[str, int]] = {}  # setting key -> device -> cell index
    labels: dict[str, str] = {}
    for c in data.cells:
        if per[c.index]:
            key, label = _setting(data, c.index)
            grid.setdefault(key, {})[per[c.index][0]] = c.index
            labels.setdefault(key, label)
    runs = {c.index: _cell_runs(data.cell_runs(c.index), w) for c in data.cells}
    base_key = _setting(data, res.base.index)[0]
    ref = fl.devices[0]
    out = [f"The device is an axis (compare): every setting ran on each of {len(fl.devices)} devices, {ref} the "
           f"reference (the base cell's).", ""] + _described(data, fl) + [""]
    table = _RatioTable(runs, {c.index: c for c in res.cells}, res, seed)
    for d in fl.devices:
        rows = [(labels[key], by[d]) for key, by in grid.items() if d in by]
        out += table.lines(f"On {d}", "setting", f"{labels.get(base_key, 'base')} on {d}", rows,
                           grid.get(base_key, {}).get(d), "base", 2)
    out += _across(table, grid, labels, fl)
    return out


def _across(table: _RatioTable, grid: dict[str, dict[str, int]], labels: dict[str, str], fl: Fleet) -> list[str]:
    """The one table with ratios between devices: each setting on each device against that setting on the
    reference device."""
    ref = fl.devices[0]
    out = ["### Across devices", "",
           f"The only ratios between devices in these findings: each setting on each device against the same setting "
           f"on {ref} (the reference device). Devices differ in more than one thing (SoC, storage, cooling, "
           f"build): such a ratio describes these devices, not one cause.", "",
           f"| setting | device | runs | tok/s [95% CI] | x the same setting on {ref} [95% CI] |",
           "|---|---|---|---|---|"]
    for key, by in grid.items():
        out += [f"| {labels[key]} | {line}" for line in table.rows([(d, by[d]) for d in fl.devices if d in by],
                                                                    by.get(ref), "reference", 3)]
    return out + [""]


@dataclass(frozen=True)
class _RatioTable:
    """A compare table: a row per cell, its tok/s and its ratio to one reference cell of the table."""

    runs: dict[int, stats.CellRuns]
    cells: dict  # cell index -> the report's cell result
    res: Results
    seed: int

    def lines(self, title: str, what: str, ref_name: str, rows: list[tuple[str, int]], ref: int | None,
              ref_word: str, salt: int) -> list[str]:
        return [f"### {title}", "", f"| {what} | runs | tok/s [95% CI] | x {ref_name} [95% CI] |", "|---|---|---|---|",
                *(f"| {x}" for x in self.rows(rows, ref, ref_word, salt)), ""]

    def rows(self, rows: list[tuple[str, int]], ref: int | None, ref_word: str, salt: int) -> list[str]:
        """Each row's name, runs, tok/s and ratio to `ref`, without the table's leading '| '."""
        out = []
        for name, i in rows:
            ratio = f"1 ({ref_word})" if i == ref else "n/a" if ref is None else fmt(_printed(
                stats.ratio_interval(self.runs[i], self.runs[ref], self.seed + 1000 * i + salt), self.res), 2, "x")
            c = self.cells[i]
            out.append(f"{name} | {c.n_ok}/{c.n_runs} | {fmt(c.tok_s)} | {ratio} |")
        return out


def device_sentence(t: DeviceTest) -> str:
    """The pooled test as one sentence."""
    return (f"one-way analysis of variance of log tok/s across devices within each cell, pooled over "
            f"{len(t.cells)} cell(s): F({t.df1}, {t.df2}) = {t.f:.2f}, {p_is(t.p)}")


def _spread(data: CampaignData, res: Results, fl: Fleet) -> list[str]:
    t = fl.test
    seed, w = data.plan.seed, data.warmup
    out = [f"The runs of one matrix were shared by {len(fl.devices)} devices (spread):", ""] + _described(data, fl)
    out += [""] + _pooling(t) + [""]
    ref = fl.devices[0]
    out += [f"| cell | device | runs | tok/s [95% CI] | x the same cell on {ref} [95% CI] |", "|---|---|---|---|---|"]
    for c in data.cells:
        by = {d: [r for r in data.cell_runs(c.index) if r.rec.device == d] for d in fl.devices}
        ref_runs = _cell_runs(by[ref], w)
        for j, d in enumerate(fl.devices):
            if not any(r.rec.finished for r in by[d]):
                continue
            cr = _cell_runs(by[d], w)
            iv = stats.cell_interval(cr, seed + 1000 * c.index + 10 + 2 * j)
            ratio = "1 (reference)" if d == ref else fmt(
                _printed(stats.ratio_interval(cr, ref_runs, seed + 1000 * c.index + 11 + 2 * j), res), 2, "x")
            n_ok = len(_ok(by[d]))
            out.append(f"| {c.label} | {d} | {n_ok}/{sum(r.rec.finished for r in by[d])} | {fmt(iv)} | {ratio} |")
    if t is not None and t.cells:
        out += ["", "| cell | devices | runs | analysis of variance p | Kruskal-Wallis p |", "|---|---|---|---|---|"]
        out += [f"| {x.label} | {x.n_devices} | {x.n_runs} | {p_text(x.p_anova)} | {p_text(x.p_kruskal)} |"
                for x in t.cells]
        out += ["", "Each cell's own tests, for where the devices differ (the decision rests on the pooled test "
                    "above; Kruskal-Wallis ranks the runs, assumes no normality and is coarse at few runs)."]
    return out + [""]


def _pooling(t: DeviceTest | None) -> list[str]:
    if t is None:
        return ["No cell ran on two devices: nothing to test."]
    if not t.tested:
        return ["**Not tested**: no device ran a cell twice, so there is no spread of runs to weigh the devices' "
                "differences against; the pooled figures assume the devices alike. Add repeats to test it."]
    if t.refuses:
        return [f"**Not pooled**: the device explains part of the variance ({device_sentence(t)} < {ALPHA}). Runs "
                f"on different devices are not repeats of one measurement here, so figures pooled over them (the "
                f"results table above) misstate the spread: read the per-device figures below, and compare the "
                f"devices with a compare campaign."]
    return [f"**Pooled**: no device effect detected ({device_sentence(t)} >= {ALPHA}); a difference between "
            f"devices smaller than the runs' own spread may go undetected at this many runs."]


def fleet_section(data: CampaignData, res: Results, fl: Fleet | None) -> list[str]:
    if fl is None:
        return []
    body = _compare(data, res, fl) if fl.use == COMPARE else _spread(data, res, fl)
    return ["## Devices", ""] + body


def fleet_verdict(data: CampaignData, res: Results, fl: Fleet | None) -> list[str] | None:
    """The verdict of a compare fleet, device by device (harness.report.fleet_verdict); of a spread campaign whose
    devices differ (instead of the pooled one); else None (the one-target verdict stands)."""
    if fl is not None and fl.use == COMPARE:
        per = _devices_of(data)
        return compare_verdict(res, fl.devices, {i: v[0] for i, v in per.items() if v},
                               {c.index: _setting(data, c.index)[1] for c in data.cells})
    if fl is None or fl.use != SPREAD or fl.test is None or not fl.test.refuses:
        return None
    return [f"**Not pooled: the devices differ.** {device_sentence(fl.test)[0].upper()}{device_sentence(fl.test)[1:]}, "
            f"below {ALPHA}. The {len(fl.devices)} devices ({', '.join(fl.devices)}) are not interchangeable "
            f"for these runs, so no pooled figure is given as the campaign's: see the per-device figures in the "
            f"Devices section."]


def fleet_warnings(fl: Fleet | None) -> list[str]:
    if fl is None or fl.use != SPREAD or fl.test is None:
        return []
    if fl.test.refuses:
        return [f"device: the results table pools runs of {len(fl.devices)} devices that differ "
                f"({device_sentence(fl.test)}): its intervals are not the campaign's; see Devices."]
    if not fl.test.tested:
        return ["device: whether the devices differ could not be tested (no device ran a cell twice); add repeats."]
    return []


def pooled_note(fl: Fleet | None) -> list[str]:
    """Above the results table of a spread campaign whose devices differ: what its figures are not."""
    if fl is None or fl.use != SPREAD or fl.test is None or not fl.test.refuses:
        return []
    return ["**Not the campaign's figures**: each cell below pools the runs of devices that differ (see Devices); "
            "its tok/s and interval describe no device.", ""]
