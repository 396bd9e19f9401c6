"""Live progress of a fleet campaign (rich): runs done of total, and one line per device: its current run
(cell, round, tokens), how many runs wait for it, or that it is waiting for the device to come back, or
lost. Past MAX_LINES devices, one summary line stands for the rest. One line per finished run is printed
as in a one-device campaign (harness.campaigns.progress), prefixed by its device.

Workers update their device's line (the engine's progress, the cooldown gate) through `DeviceLine`;
rich's Progress takes updates from any thread. Run ends and device events come from the writer thread."""

from __future__ import annotations

from rich.console import Console

from harness.campaigns.progress import Bars

MAX_LINES = 24


class DeviceLine:
    """What one_run reports during a run on one device (`waiting` from the gate, `token` per progress line).
    Once `stopped` (Ctrl-C), a gate wait ends the run before it starts (KeyboardInterrupt)."""

    def __init__(self, progress: FleetProgress, label: str):
        self.p = progress
        self.label = label
        self.stopped = False
        self.run = ""

    def waiting(self, why: str) -> None:
        if self.stopped:
            raise KeyboardInterrupt
        self.p.set(self.label, f"{self.run} cooldown: {why}")

    def token(self, d: dict) -> None:
        step, steps = d.get("step"), d.get("steps")
        if isinstance(step, int | float):
            ms = d.get("wall_ms")
            rate = f", {1000 / ms:.2f} tok/s" if isinstance(ms, int | float) and ms > 0 else ""
            self.p.set(self.label, f"{self.run} token {step:g}/{steps or '?'}{rate}")


class FleetProgress(Bars):
    def __init__(self, console: Console, labels: list[str], *, total_runs: int, done_runs: int, rounds: str):
        super().__init__(console)
        self.labels = labels
        self.rounds = rounds
        self.total = total_runs
        self.done = done_runs
        self.failed = 0
        self.text: dict[str, str] = dict.fromkeys(labels, "starting")
        self.queued: dict[str, int] = dict.fromkeys(labels, 0)
        self.t_runs = self.p.add_task(self._runs_desc(), total=total_runs, completed=done_runs)
        shown = labels if len(labels) <= MAX_LINES else labels[:MAX_LINES - 1]
        self.t_dev = {x: self.p.add_task(f"{x}: starting", total=None) for x in shown}
        self.t_rest = self.p.add_task("", total=None) if len(shown) < len(labels) else None

    def line(self, label: str) -> DeviceLine:
        return DeviceLine(self, label)

    def set(self, label: str, text: str) -> None:
        self.text[label] = text
        if label in self.t_dev:
            q = self.queued.get(label, 0)
            self.p.update(self.t_dev[label], description=f"{label}: {text}" + (f" | {q} queued" if q else ""))
        elif self.t_rest is not None:
            rest = [x for x in self.labels if x not in self.t_dev]
            busy = sum(self.text[x].startswith("r") for x in rest)
            self.p.update(self.t_rest, description=f"{len(rest)} more devices: {busy} running")

    def queue(self, label: str, n: int) -> None:
        self.queued[label] = n

    def start(self, label: str, run_id: str, cell: str, rnd: int, of: str | None = None) -> None:
        self.set(label, f"{run_id} {cell}, round {rnd}/{of or self.rounds}")

    def end(self, label: str, run_id: str, cell: str, rec: dict) -> None:
        """One line per finished run, then the totals."""
        self.done += 1
        if rec.get("status") != "ok":
            self.failed += 1
            self.console.print(f"{label} {run_id} {cell}: [red]failed[/red]: {rec.get('reason')}", highlight=False)
        else:
            rate = rec.get("tok_s_all")
            self.console.print(f"{label} {run_id} {cell}: ok, {rec.get('tokens')} tokens"
                               f"{f', {rate:.3g} tok/s (all tokens)' if rate else ''}, {rec.get('wall_s', 0):.1f} s",
                               highlight=False)
        self.set(label, "idle")
        self.p.update(self.t_runs, completed=self.done, description=self._runs_desc())

    def note(self, label: str, text: str, *, say: bool = False) -> None:
        """A device event (waiting for it, back, lost); `say`: also one printed line."""
        self.set(label, text)
        if say:
            self.console.print(f"{label}: {text}", highlight=False)

    def _runs_desc(self) -> str:
        failed = f", {self.failed} failed" if self.failed else ""
        return f"runs on {len(self.labels)} devices{failed}"
