"""Live progress of a campaign (rich): runs done of total with an ETA, the current cell and round, and
the current run's tokens from the engine's BMOE_PROGRESS lines; with repeats driven by precision, the
widest ratio interval after each round and the decision."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Self

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness import stats


def eta_text(durations: list[float], remaining: int, current_elapsed: float) -> str:
    """Remaining time from the mean duration of the runs finished in this session (gate waits included)."""
    if not durations:
        return "ETA after the first run"
    mean = sum(durations) / len(durations)
    left = max(0.0, mean * remaining - min(current_elapsed, mean))
    m, s = divmod(int(left + 0.5), 60)
    h, m = divmod(m, 60)
    return f"ETA {h}h{m:02d}m" if h else f"ETA {m}m{s:02d}s"


class Bars:
    """rich's bars on the console, live while the campaign runs (a `with` block): a one-device campaign's
    (RunProgress) and a fleet's (harness.campaigns.fleet.progress)."""

    def __init__(self, console: Console):
        self.console = console
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=console, transient=False)

    def __enter__(self) -> Self:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.p.__exit__(*exc)


class RunProgress(Bars):
    def __init__(self, console: Console, *, total_runs: int, done_runs: int, n_cells: int, tokens: int,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(console)
        self.clock = clock
        self.durations: list[float] = []
        self.t_start = clock()
        self.tokens = tokens
        self.n_cells = n_cells
        self.total = total_runs
        self.done = done_runs
        self.failed = 0
        self.precise = ""  # after a round of a campaign with precision: how far from it
        self.t_runs = self.p.add_task(f"runs ({n_cells} cells)", total=total_runs, completed=done_runs)
        self.t_tok = self.p.add_task("tokens", total=tokens, completed=0)

    def start_run(self, run_id: str, label: str, rnd: int, repeats: int | str, cell: int = 0) -> None:
        self.t_start = self.clock()
        self._runs_desc(current=True)
        self.p.update(self.t_tok, completed=0, total=self.tokens,
                      description=f"{run_id} cell {cell + 1}/{self.n_cells} {label}, round {rnd}/{repeats}: tokens")

    def waiting(self, why: str) -> None:
        self.p.update(self.t_tok, description=f"cooldown: {why}")

    def note(self, text: str) -> None:
        """Between runs: what the runner waits for (the next try of a replicating campaign)."""
        self.p.update(self.t_tok, description=text)

    def token(self, d: dict) -> None:
        step = d.get("step")
        steps = d.get("steps") or self.tokens
        if isinstance(step, int | float):
            ms = d.get("wall_ms")
            extra = f" {1000 / ms:.2f} tok/s" if isinstance(ms, int | float) and ms > 0 else ""
            self.p.update(self.t_tok, completed=step, total=steps)
            self._runs_desc(current=True)
            if extra:
                desc = self.p.tasks[self.t_tok].description.split(" |")[0]
                self.p.update(self.t_tok, description=f"{desc} |{extra}")

    def end_run(self, run_id: str, label: str, rec: dict) -> None:
        """One line per finished run (also the whole log when stderr is not a terminal)."""
        self.done += 1
        if rec.get("status") != "ok":
            self.failed += 1
            self.console.print(f"{run_id} {label}: [red]failed[/red]: {rec.get('reason')}", highlight=False)
        else:
            rate = rec.get("tok_s_all")
            self.console.print(f"{run_id} {label}: ok, {rec.get('tokens')} tokens"
                               f"{f', {rate:.3g} tok/s (all tokens)' if rate else ''}, {rec.get('wall_s', 0):.1f} s"
                               f"{', gate: ' + rec['gate']['reason'] if rec.get('gate', {}).get('reason') else ''}",
                               highlight=False)
        self.durations.append(self.clock() - self.t_start)
        self._runs_desc(current=False)

    def deferred(self, run_id: str, label: str, why: str, again: bool) -> None:
        """A run the gate gave up on, not started (cooldown.on_timeout: defer): one line."""
        then = "tried again at the end of the queue" if again else "left unrun in this session"
        self.console.print(f"{run_id} {label}: [yellow]deferred[/yellow], not run hot ({why}): {then}",
                           highlight=False)

    def add_runs(self, n: int) -> None:
        """A round added (precision): n more runs to go."""
        self.total += n
        self.p.update(self.t_runs, total=self.total)
        self._runs_desc(current=False)

    def precision(self, rounds: int, half_width: float, widths: dict[str, float], decision: str | None) -> None:
        """One line after a round from the minimum on: the ratios' half-widths against the target, what next."""
        within = sum(w <= half_width for w in widths.values())
        widest = max(widths, key=lambda k: widths[k]) if widths else None
        far = f"; widest {widest} +-{widths[widest]:.1%}" if widest is not None else ""
        then = {stats.PRECISE: "precise: stopping", stats.AT_MAX: "the maximum: stopping",
                stats.NO_RUNS: "a cell has no usable run (its runs failed): stopping; fix the cause, then "
                               "--retry-failed"}.get(decision or "", "adding a round")
        self.precise = f"{within}/{len(widths)} ratios within +-{half_width:.0%}"
        self.console.print(f"after round {rounds}: {self.precise} (at 99%){far}; {then}", highlight=False)
        self._runs_desc(current=False)

    def _runs_desc(self, current: bool) -> None:
        remaining = self.total - self.done
        eta = eta_text(self.durations, remaining, self.clock() - self.t_start if current else 0.0)
        failed = f", {self.failed} failed" if self.failed else ""
        prec = f", {self.precise}" if self.precise else ""
        self.p.update(self.t_runs, completed=self.done,
                      description=f"runs ({self.n_cells} cells{failed}{prec}, {eta})")
