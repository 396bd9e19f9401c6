"""A campaign's device preparation (its `prepare:` key, harness.formats.campaign_prepare) over its adb devices:

    with preparing(folder, spec, console) as prep:   # every device prepared is restored at the end, however it ends
        prep.ensure(target)                          # before a device's first run (a fleet: each time it is opened)
        ...runs...

`ensure` first puts back what an earlier session left on that device (a journal not restored: the host was
killed), then reads the device, checks its battery, writes the journal (harness.formats.prepared) with every
original value, and only then changes the device; the engine's pin goes on the target (`argv_prefix`, put in front
of every run's command line by harness.campaigns.rounds). A device opened again (it went away) gets the same
changes again from its journal, never its state then as the original. `restore_folder` is `bmoe-bench devices
--restore FOLDER`. What to change is `plan_items`, pure."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from harness import interrupts
from harness.campaigns.store import iso
from harness.devices.cores import cpu_mask, fastest_cores, policies_of
from harness.devices.prepare import Observed, apply, observe, pin_command, read_battery, restore, set_governor
from harness.devices.remote import RemoteShell
from harness.errors import UserError
from harness.formats import prepared as fmt
from harness.formats.campaign_prepare import PrepareSpec
from harness.formats.prepared import (
    BatteryItem,
    GovernorItem,
    Item,
    Journal,
    Pin,
    ScreenItem,
    StayOnItem,
)

BATTERY_POLL_S = 10.0
STAY_ON_TRUE = "7"  # what `svc power stayon true` sets: AC | USB | WIRELESS


@dataclass
class Planned:
    """What preparation will do on one device (plan_items)."""

    items: list[Item] = field(default_factory=list)
    pin_cpus: tuple[int, ...] = ()
    pin_policies: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_items(spec: PrepareSpec, seen: Observed, serial: str) -> Planned:
    """The changes `spec` asks of a device seen as `seen` (only those that change something), the cores to pin the
    engine to, and notes on what is left as it is. UserError when the device cannot tell what a change needs."""
    out = Planned()

    def cannot(what: str, tool: str) -> UserError:
        return UserError(f"adb device {serial}: prepare.{what} needs {tool}, which does not answer there; "
                         f"remove prepare.{what}, or use an Android device")

    if spec.screen == "stay_awake":
        if seen.stay_on is None:
            raise cannot("screen", "`settings get global stay_on_while_plugged_in`")
        out.items.append(StayOnItem(kind="stay_on", original=seen.stay_on, applied=STAY_ON_TRUE))
    elif spec.screen == "turn_off":
        if seen.awake is None:
            raise cannot("screen", "`dumpsys power`")
        if seen.awake:
            out.items.append(ScreenItem(kind="screen", original="awake", applied="asleep"))
        else:
            out.notes.append("screen already off")
    if spec.charger == "unplug":
        if seen.battery is None:
            raise cannot("charger", "`dumpsys battery`")
        if seen.battery_frozen:
            out.notes.append("battery service already frozen by someone else (UPDATES STOPPED): charger left as "
                             "it shows")
        else:
            out.items.append(BatteryItem(kind="battery", original="live", applied="unplugged"))
    if spec.pin_cores is not None:
        if not seen.policies:
            out.notes.append("no cpufreq policies readable: engine not pinned")
        else:
            out.pin_cpus = fastest_cores(seen.policies, spec.pin_cores)
            if len(out.pin_cpus) < spec.pin_cores:
                out.notes.append(f"pin_cores {spec.pin_cores}: the device has {len(out.pin_cpus)} cores")
            out.pin_policies = [p.name for p in policies_of(seen.policies, out.pin_cpus)]
    if spec.governor is not None:
        targets = policies_of(seen.policies, out.pin_cpus) if out.pin_cpus else seen.policies
        if not targets:
            out.notes.append(f"no cpufreq policies readable: governor {spec.governor} not set")
        for p in targets:
            if p.governors and spec.governor not in p.governors:
                out.notes.append(f"{p.name} does not offer governor {spec.governor} (it offers "
                                 f"{' '.join(p.governors)}): {p.governor} left in force")
            elif p.governor is None:
                out.notes.append(f"{p.name}'s governor is unreadable: {spec.governor} not set")
            elif p.governor != spec.governor:
                out.items.append(GovernorItem(kind="governor", policy=p.name, original=p.governor,
                                              applied=spec.governor))
    return out


def _server(dev: RemoteShell) -> str:
    client = getattr(dev, "client", None)
    return client.name if client is not None else "127.0.0.1:5037"


class Preparer:
    """The campaign's preparation of each adb device it runs on (see the module's docstring)."""

    def __init__(self, folder: Path, spec: PrepareSpec, console: Console):
        self.folder, self.spec, self.console = Path(folder), spec, console
        self.journals: dict[str, tuple[Journal, RemoteShell]] = {}
        self._lock = threading.Lock()

    def ensure(self, target: object) -> None:
        """Prepare the target's device (once; again from its journal when it was opened again). Not adb: nothing."""
        if getattr(target, "kind", None) != "adb" or not self.spec.active():
            return
        dev: RemoteShell = target.device  # type: ignore[attr-defined]
        with self._lock:
            have = self.journals.get(dev.serial)
        if have is not None:
            self._reapply(have[0], dev)
        else:
            leftover(self.folder, dev, self.console)
            j = self._prepare(dev)
            with self._lock:
                self.journals[dev.serial] = (j, dev)
            have = (j, dev)
        target.argv_prefix = list(have[0].pin.command) if have[0].pin else []  # type: ignore[attr-defined]

    def _prepare(self, dev: RemoteShell) -> Journal:
        seen = observe(dev)
        level = self._battery_ok(dev, seen)
        planned = plan_items(self.spec, seen, dev.serial)
        pin = None
        if planned.pin_cpus:
            mask = cpu_mask(planned.pin_cpus)
            words = pin_command(dev, mask)
            if words is None:
                planned.notes.append(f"neither `taskset {mask}` nor `toybox taskset {mask}` runs there: engine not "
                                     f"pinned")
                self.console.print(f"{dev.serial}: cannot pin the engine to cpu {fmt.cpu_list(planned.pin_cpus)}: "
                                   f"no taskset there; it runs on every core", highlight=False)
            else:
                pin = Pin(cpus=list(planned.pin_cpus), mask=mask, command=words, policies=planned.pin_policies)
        b = seen.battery or {}
        j = Journal(format=fmt.FORMAT, version=fmt.VERSION, serial=dev.serial, server=_server(dev), state="applying",
                    created=iso(time.time()), items=planned.items, charger=self.spec.charger,
                    charger_seen=b.get("plugged"), battery_level=level,
                    governors={p.name: p.governor for p in seen.policies if p.governor is not None},
                    pin=pin, notes=planned.notes)
        fmt.save(self.folder, j)  # before any change: the originals are on disk first
        try:
            refused = self._apply_all(j, dev)
        except BaseException:
            why = restore_journal(self.folder, j, dev)
            if why:
                self.console.print(f"{dev.serial}: {why}", highlight=False)
            raise
        if refused:
            j.items = [it for it in j.items if it not in refused]
            in_force = ", ".join(f"{g.policy} {g.original}" for g in refused)
            j.governor_refused = f"governor {self.spec.governor} could not be set (not root?): {in_force} in force"
            self.console.print(f"{dev.serial}: governor {self.spec.governor} could not be set (not root?); the "
                               f"governor in force is recorded: {in_force}", highlight=False)
        j.state = "applied"
        fmt.save(self.folder, j)
        self.console.print(f"{dev.serial}: prepared: {j.summary(refused=False)}", highlight=False)
        return j

    def _apply_all(self, j: Journal, dev: RemoteShell) -> list[GovernorItem]:
        """Apply every item; the governor items the device refused (left as they were)."""
        refused: list[GovernorItem] = []
        for it in j.items:
            interrupts.check()
            if isinstance(it, GovernorItem):
                if not set_governor(dev, it.policy, it.applied):
                    refused.append(it)
            else:
                apply(dev, it)
        return refused

    def _reapply(self, j: Journal, dev: RemoteShell) -> None:
        if j.state == "applied":
            self._apply_all(j, dev)

    def _battery_ok(self, dev: RemoteShell, seen: Observed) -> int | None:
        """The battery level at the start, after waiting up to battery_wait_s for battery_min_pct; UserError below."""
        level = (seen.battery or {}).get("level")
        want = self.spec.battery_min_pct
        if want is None:
            return level
        if level is None:
            raise UserError(f"adb device {dev.serial}: prepare.battery_min_pct needs its battery level (`dumpsys "
                            f"battery`), which it does not report; remove battery_min_pct")
        deadline = time.monotonic() + self.spec.battery_wait_s
        said = False
        while level < want and time.monotonic() < deadline:
            if not said:
                self.console.print(f"{dev.serial}: battery at {level}%, waiting up to {self.spec.battery_wait_s:g} s "
                                   f"for {want}% (prepare.battery_min_pct)", highlight=False)
                said = True
            end = min(deadline, time.monotonic() + min(BATTERY_POLL_S, max(1.0, self.spec.battery_wait_s / 20)))
            while time.monotonic() < end:
                interrupts.check()
                time.sleep(0.2)
            level = (read_battery(dev)[0] or {}).get("level", level)
        if level < want:
            raise UserError(f"adb device {dev.serial}: battery at {level}%, below prepare.battery_min_pct ({want}%)"
                            f"{f' after {self.spec.battery_wait_s:g} s' if self.spec.battery_wait_s else ''}: "
                            f"charge it, or lower the minimum")
        return level

    def restore_all(self) -> None:
        """Put every prepared device back; one line per device that could not be (its journal kept)."""
        with self._lock:
            todo = list(self.journals.values())
            self.journals.clear()
        for j, dev in todo:
            why = restore_journal(self.folder, j, dev)
            if why:
                self.console.print(f"{dev.serial}: not restored: {why}; `bmoe-bench devices --restore "
                                   f"{self.folder}` puts it back later", highlight=False)


@contextmanager
def preparing(folder: Path, spec: PrepareSpec | None, console: Console) -> Iterator[Preparer | None]:
    """A Preparer whose devices are restored when the block ends, however it ends (None without `prepare:`)."""
    if spec is None or not spec.active():
        yield None
        return
    prep = Preparer(folder, spec, console)
    try:
        yield prep
    finally:
        prep.restore_all()


def restore_journal(folder: Path, j: Journal, dev: RemoteShell) -> str | None:
    """Put back every item of the journal (last changed first) and mark it restored: None, or what is left."""
    left: list[str] = []
    for it in reversed(j.items):
        try:
            why = restore(dev, it)
        except dev.gone as e:
            return f"the device stopped answering while it was restored: {e}"
        if why:
            left.append(why)
    if left:
        return "; ".join(left)
    j.state, j.restored = "restored", iso(time.time())
    fmt.save(folder, j)
    return None


def leftover(folder: Path, dev: RemoteShell, console: Console) -> None:
    """If an earlier session left this device prepared (its journal not restored), put it back first, saying so."""
    p = fmt.journal_path(folder, dev.serial)
    if not p.is_file():
        return
    j = fmt.load(p)
    if j.state == "restored":
        return
    console.print(f"{dev.serial}: restoring what an earlier session left changed ({p}): {j.summary()}",
                  highlight=False)
    why = restore_journal(folder, j, dev)
    if why:
        raise UserError(f"adb device {dev.serial}: cannot restore what {p} records ({why}); put it back by hand, "
                        f"then remove that file")


def restore_folder(folder: Path, console: Console, connect) -> int:
    """`bmoe-bench devices --restore FOLDER`: every journal of the folder not restored, put back through
    connect(serial, host, port) -> RemoteShell. The number of devices left as they were (0: all restored)."""
    from harness.formats.campaign_fleet import parse_server

    failed = 0
    todo = fmt.journals(folder)
    for p in todo:
        try:
            j = fmt.load(p)  # a journal refused leaves its device alone; the others are still put back
        except UserError as e:
            failed += 1
            console.print(str(e), highlight=False, soft_wrap=True)
            continue
        if j.state == "restored":
            console.print(f"{j.serial}: already restored ({p.name})", highlight=False)
            continue
        try:
            dev = connect(j.serial, *parse_server(j.server))
            why = restore_journal(folder, j, dev)
        except UserError as e:
            why = str(e)
        if why:
            failed += 1
            console.print(f"{j.serial}: not restored: {why}", highlight=False, soft_wrap=True)
        else:
            console.print(f"{j.serial}: restored ({j.summary()})", highlight=False, soft_wrap=True)
    if not todo:
        console.print(f"{folder}: no device-preparation journal (prepared/*.json): nothing to restore",
                      highlight=False)
    return failed
