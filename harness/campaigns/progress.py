"""Live progress of a campaign (rich): runs done of total with an ETA, the current cell and round, and
the current run's tokens from the engine's BMOE_PROGRESS lines."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class RunProgress:
    def __init__(self, console: Console, *, total_runs: int, done_runs: int, n_cells: int, tokens: int):
        self.console = console
        self.tokens = tokens
        self.n_cells = n_cells
        self.total = total_runs
        self.done = done_runs
        self.failed = 0
        self.p = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=False)
        self.t_runs = self.p.add_task(f"runs ({n_cells} cells)", total=total_runs, completed=done_runs)
        self.t_tok = self.p.add_task("tokens", total=tokens, completed=0)

    def __enter__(self) -> RunProgress:
        self.p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.p.__exit__(*exc)

    def start_run(self, run_id: str, label: str, rnd: int, repeats: int, cell: int = 0) -> None:
        self.p.update(self.t_tok, completed=0, total=self.tokens,
                      description=f"{run_id} cell {cell + 1}/{self.n_cells} {label}, round {rnd}/{repeats}: tokens")

    def waiting(self, why: str) -> None:
        self.p.update(self.t_tok, description=f"cooldown: {why}")

    def token(self, d: dict) -> None:
        step = d.get("step")
        steps = d.get("steps") or self.tokens
        if isinstance(step, int | float):
            ms = d.get("wall_ms")
            extra = f" {1000 / ms:.2f} tok/s" if isinstance(ms, int | float) and ms > 0 else ""
            self.p.update(self.t_tok, completed=step, total=steps)
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
        self.p.update(self.t_runs, completed=self.done,
                      description=f"runs ({self.n_cells} cells{f', {self.failed} failed' if self.failed else ''})")
