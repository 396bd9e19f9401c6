"""A fleet campaign's runs: every device at once through harness.campaigns.fleet.scheduler, each run done by
rounds.one_run on its device's Target (its own fixed cool-down between runs, cooldown gate, state sampler and
staged files; a run deferred by its gate goes to the end of the queue: harness.campaigns.steady), its folder
committed by its worker; the manifest written by this thread alone, after a batch of finished runs (held back
while its writes would take over 5% of the time: store.ManifestSaver).

    run_fleet(plan, m, folder, members, console, grace_s=..., opened=...)  -> CampaignResult

`members` are `FleetMember`s: a label and `open()`, which connects (or reconnects) and stages the engine
and model on that device (`device_opener` builds one from a FleetDevice and a Target factory: AdbTarget
by default; the scheduler benchmark passes a fake fast target). Each run's record gets its device's
label; a device opened (or back) gets its description in the manifest's `devices`, and the first time its
fingerprint and storage in `provenance.devices`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from rich.console import Console

from harness.campaigns import store
from harness.campaigns.fleet.devices import FleetDevice, owner_of
from harness.campaigns.fleet.progress import DeviceLine, FleetProgress
from harness.campaigns.fleet.scheduler import Event, Member, schedule
from harness.campaigns.provenance import device_provenance
from harness.campaigns.replicate import by_try, round_of, try_due, wait_for_try
from harness.campaigns.rounds import CampaignResult, closing, one_run
from harness.campaigns.steady import Pacer, left_unrun
from harness.campaigns.validate import Plan
from harness.errors import UserError
from harness.formats.manifest import DeviceProvenance, Manifest
from harness.formats.outcome import Deferral
from harness.targets.base import Target


class TargetSession:
    """A device opened for runs: its Target, its resolved inputs (staged there) and its description."""

    def __init__(self, label: str, plan: Plan, m: Manifest, folder: Path, target: Target, res, desc: dict,
                 line: DeviceLine | None, prov: DeviceProvenance | None = None):
        self.label, self.plan, self.m, self.folder = label, plan, m, folder
        self.target, self.res, self.desc, self.prov = target, res, desc, prov
        self.line = line if line is not None else _Quiet(label)
        self.pacer = Pacer(plan.campaign.cooldown.between_runs_s)  # this device's own runs, one after another

    def run_one(self, index: int):
        r = self.m.runs[index]
        self.line.run = r.run_id
        want = self.m.provenance.model_sha256 if self.m.provenance else None
        return one_run(self.plan, r, self.folder, self.target, self.res, self.line, want, None, self.pacer)

    def gone(self) -> str | None:
        err = self.target.sample_state().get("error")
        return str(err) if err else None

    def interrupt(self) -> None:
        self.line.stopped = True
        stop = getattr(self.target, "interrupt", None)
        if stop is not None:
            stop()

    def close(self) -> None:
        self.target.close()


class _Quiet:
    """A DeviceLine that shows nothing (no live display)."""

    def __init__(self, label: str):
        self.label, self.stopped, self.run = label, False, ""

    def waiting(self, why: str) -> None:
        if self.stopped:
            raise KeyboardInterrupt

    def token(self, d: dict) -> None:
        pass


@dataclass
class FleetMember:
    device: FleetDevice
    open: Callable[[DeviceLine | None], TargetSession]  # connect (again) and stage; raises when it cannot


def adb_target(d: FleetDevice) -> Target:
    from harness.targets.adb import AdbTarget

    return AdbTarget(d.serial, host=d.host, port=d.port)


def device_opener(plan: Plan, d: FleetDevice, resolve: Callable, folder_m: Callable[[], tuple[Path, Manifest]],
                  make: Callable[[FleetDevice], Target] = adb_target) -> FleetMember:
    """A member whose open() makes its Target the first time (reconnects it after), stages the campaign's
    inputs there (resolve(plan, target): runner.resolve_inputs; unchanged files are not pushed again) and
    checks its engine reports the version(s) the folder started with."""
    box: dict[str, Target] = {}
    lock = threading.Lock()

    def open_(line: DeviceLine | None) -> TargetSession:
        with lock:
            t = box.get("t")
            if t is None:
                t = box["t"] = make(d)
            else:
                again = getattr(t, "reconnect", None)
                if again is not None:
                    again()
            res = resolve(plan, t, Console(file=StringIO()))
            folder, m = folder_m()
            bad = version_mismatch(m, res, d.label) if m is not None else None
            if bad is not None:
                raise UserError(bad)
            desc = {**t.describe(), "server": d.server} if t.kind == "adb" else t.describe()
            prov = device_provenance(t, desc, res.model_path)
            return TargetSession(d.label, plan, m, folder, t, res, desc, line, prov)

    return FleetMember(d, open_)


def run_fleet(plan: Plan, m: Manifest, folder: Path, members: list[FleetMember], console: Console, *,
              grace_s: float, opened: dict[str, TargetSession] | None = None, poll_s: float = 1.0,
              live: bool = True, on_open: Callable[[Target], None] | None = None) -> CampaignResult:
    """Every pending run of the manifest over the fleet (harness.campaigns.fleet.scheduler), the manifest saved by
    this thread after each batch of events; its status at the end: complete, or what is left and why. `on_open`
    gets each device's Target before its runs, each time it is opened (the campaign's device preparation)."""
    skipped = sum(r.finished for r in m.runs)
    labels = [x.device.label for x in members]
    rounds = str(plan.campaign.min_repeats())
    prog = FleetProgress(console, labels, total_runs=len(m.runs), done_runs=skipped, rounds=rounds)
    lines = {x: prog.line(x) if live else None for x in labels}
    sessions: dict[str, TargetSession] = {}
    for label, s in (opened or {}).items():
        if on_open is not None:
            on_open(s.target)
        s.line = lines[label] or s.line
        s.m, s.folder = m, folder  # opened before the folder was made
        sessions[label] = s
    owner = owner_of(plan)
    cells = plan.cells

    def member(x: FleetMember) -> Member:
        def open_() -> TargetSession:
            s = x.open(lines[x.device.label])
            if on_open is not None:
                on_open(s.target)
            sessions[x.device.label] = s
            return s
        return Member(x.device.label, open_)

    def queued(i: int, n: int) -> None:  # runs waiting for a device: its own (compare), or anyone's (spread)
        key = owner[m.runs[i].cell] if owner is not None else ""
        waiting[key] = waiting.get(key, 0) + n
        for x in labels if owner is None else [key]:
            prog.queue(x, waiting[key])

    def on_events(batch: list[Event]) -> None:
        dirty = False
        for ev in batch:
            if ev.kind == "start":
                r = m.runs[ev.index]
                queued(ev.index, -1)
                prog.start(ev.label, r.run_id, cells[r.cell].label, *round_of(r, m.campaign, rounds))
            elif ev.kind == "done":
                outcome, hashes = ev.result
                r = m.runs[ev.index]
                if r.finished:  # handed over again on Ctrl-C (scheduler._hand_over_done): recorded already
                    continue
                m.runs[ev.index] = r.finish(outcome, hashes, device=ev.label)
                dirty = True
                prog.end(ev.label, r.run_id, cells[r.cell].label, outcome.dump())
            elif ev.kind == "deferred":
                d, r = ev.result, m.runs[ev.index]
                if r.finished or (r.deferrals and r.deferrals[-1] == d):  # handed over again on Ctrl-C
                    continue
                m.runs[ev.index] = r.defer(d)
                dirty = True
                then = "tried again at the end of the queue" if ev.text == "again" else "left unrun in this session"
                prog.note(ev.label, f"{r.run_id} {cells[r.cell].label}: deferred, not run hot ({d.reason}): {then}",
                          say=True)
            elif ev.kind == "back":
                dirty |= _describe(m, ev.label, sessions.get(ev.label))
                prog.note(ev.label, "ready", say=ev.label in gone_once)
            elif ev.kind == "waiting":
                first = ev.label not in gone_once
                gone_once.add(ev.label)
                prog.note(ev.label, f"not answering: {ev.text}", say=first)
            elif ev.kind == "lost":
                prog.note(ev.label, f"lost: {ev.text}", say=True)
        if dirty:
            saver.save(m)  # at most 5% of the time (store.ManifestSaver); always at the end (rounds.closing)

    saver = store.ManifestSaver(folder)
    gone_once: set[str] = set()
    for label, s in sessions.items():
        _describe(m, label, s)
    pending = [i for i, r in enumerate(m.runs) if not r.finished]
    waiting: dict[str, int] = {}
    for i in pending:
        queued(i, 1)
    def show_all(text: str) -> None:  # the wait between tries, on every device's line
        for x in labels:
            prog.set(x, text)

    left: list[str] = []
    lost: dict[str, str] = {}
    deferred: list[int] = []  # runs left unrun past max_deferrals (the device stayed hot)
    with closing(folder, m):
        with prog:
            for k, part in by_try(m, pending):  # a replicating campaign: one try at a time, waits between
                if k is not None and try_due(m, k) is not None:
                    saver.flush(m)
                    wait_for_try(m, k, show_all, say=lambda s: console.print(s, highlight=False))
                rep = schedule(part, [member(x) for x in members],
                               owner=(lambda i: owner[m.runs[i].cell]) if owner is not None else None,
                               on_events=on_events, grace_s=grace_s, poll_s=poll_s, opened=dict(sessions),
                               deferred=lambda x: isinstance(x, Deferral),
                               max_deferrals=plan.campaign.cooldown.max_deferrals)
                left += [m.runs[i].run_id for i in rep.not_run]
                lost.update(rep.lost)
                deferred += rep.deferred
        why = "; ".join(f"{k}: {v}" for k, v in lost.items())
        parts = [f"{len(left)} run(s) not run" + (f" (devices lost: {why})" if why else "")] if left else []
        hot = left_unrun(m.runs[i] for i in deferred)  # "incomplete: N run(s) deferred, ..."
        parts += [hot.removeprefix("incomplete: ")] if hot else []
        m.status = ("complete" if all(r.finished for r in m.runs) else
                    "incomplete: " + "; ".join(parts) if parts else "running")
    return CampaignResult.of(folder, m, skipped, n_not_run=len(left), not_run=why, deferred=deferred)


def _describe(m: Manifest, label: str, s: TargetSession | None) -> bool:
    """Record a device's description in the manifest once it has been opened (again), and its provenance (its
    fingerprint and storage) the first time; True when recorded."""
    if s is None:
        return False
    m.devices = {**(m.devices or {}), label: s.desc}
    pv = m.provenance
    if pv is not None and s.prov is not None and label not in (pv.devices or {}):
        pv.devices = {**(pv.devices or {}), label: s.prov}
    return True


def version_mismatch(m: Manifest, res, label: str) -> str | None:
    """Why a device may not run this folder's runs: its engine reports another version than the folder's."""
    was = {k: e.version for k, e in m.engines.items()} if m.engines else {"": m.engine.version}
    for k, ver in res.versions().items():
        if was.get(k) != ver:
            return (f"{label}: its engine{' ' + k if k else ''} reports {ver!r}, the campaign's ran {was.get(k)!r}; "
                    f"runs from two builds do not compare")
    return None
