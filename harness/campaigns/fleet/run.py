"""Run or resume a fleet campaign (the file's `targets:` or `fleet:`): find its devices, plan over them,
open them all at once (connect, stage the engine and model: pushed once per device, an unchanged file
skipped by its sha256), choose or create the folder as a one-device campaign does (same locks, same
resume rules), then harness.campaigns.fleet.rounds.run_fleet.

A device that cannot be opened at the start (its server does not answer, it is not listed, staging
failed) is one line naming it and why; its runs wait for it up to `fleet.device_grace_s`, like a device
that goes away later. A server is never replaced by a local one (harness.devices.adb_client). With no device
usable at all, nothing starts. spread needs devices of one kind (the same model): refused otherwise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from harness import interrupts
from harness.campaigns import folder_setup, store
from harness.campaigns.fleet.devices import FleetDevice, fleet_plan, listed_devices, selected_devices, use_of
from harness.campaigns.fleet.rounds import (
    FleetMember,
    TargetSession,
    adb_target,
    device_opener,
    run_fleet,
    version_mismatch,
)
from harness.campaigns.prepared import preparing
from harness.campaigns.provenance import campaign_provenance
from harness.campaigns.rounds import CampaignResult
from harness.campaigns.shard import Shard, shard_plan
from harness.campaigns.validate import Plan
from harness.errors import ResourceError, UserError
from harness.formats.campaign_fleet import parse_server
from harness.formats.campaign_replicate import tries_text
from harness.formats.manifest import Manifest, load_manifest, plan_hash
from harness.targets.base import Target

DEFAULT_GRACE_S = 300.0


@dataclass(frozen=True)
class Kit:
    """What a fleet campaign shares with a one-device one, handed over by harness.campaigns.runner (which
    calls this module: importing it back would make a cycle)."""

    plan_record: Callable  # (plan) -> PlanRecord
    new_manifest: Callable  # (plan, rec, target_desc, res, t) -> Manifest
    resolve_inputs: Callable  # (plan, target, console) -> Resolved (stages the engine and model)
    note_other_plans: Callable  # (root, plan, hash, console)
    refuse_unhashed: Callable  # (folder, manifest)
    git_commit: Callable  # (cwd) -> {commit, dirty}


def open_all(members: list[FleetMember]) -> tuple[dict[str, TargetSession], dict[str, str]]:
    """Open every device at once, one try each: (the sessions opened, by label; why each other one was not). Each
    opens on a daemon thread and this thread waits for them checking for a stop request, so SIGTERM or Ctrl-C is
    honoured at once even while a device's server hangs (its calls are bounded too: harness.devices.timeouts)."""
    if not members:
        return {}, {}
    got: dict[int, TargetSession | str | BaseException] = {}
    done = threading.Event()
    lock = threading.Lock()

    def one(i: int, x: FleetMember) -> None:
        try:
            r: TargetSession | str | BaseException = x.open(None)
        except ResourceError as e:
            r = e
        except Exception as e:
            r = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        with lock:
            got[i] = r
            if len(got) == len(members):
                done.set()

    for i, x in enumerate(members):
        threading.Thread(target=one, args=(i, x), name=f"open-{x.device.label}", daemon=True).start()
    while not done.wait(0.2):
        interrupts.check()
    for g in got.values():
        if isinstance(g, BaseException):
            raise g
    res = [got[i] for i in range(len(members))]
    opened = {x.device.label: g for x, g in zip(members, res, strict=True) if isinstance(g, TargetSession)}
    why = {x.device.label: g for x, g in zip(members, res, strict=True) if isinstance(g, str)}
    return opened, why


def run_fleet_campaign(plan: Plan, kit: Kit, *, root: Path, console: Console, fresh: bool = False,
                       retry_failed: bool = False, make_target: Callable[[FleetDevice], Target] = adb_target,
                       poll_s: float = 1.0, shard: Shard | None = None) -> CampaignResult:
    """Run or resume the fleet campaign `plan` (see the module's docstring); its devices' Targets are made by
    make_target (AdbTarget by default; the scheduler benchmark passes its fake fast target); `shard`: only that
    shard's rounds (harness.campaigns.shard), in a folder of its own with the whole plan's hash."""
    c = plan.campaign
    if c.targets is not None:
        devices = listed_devices(plan)
    else:
        devices, _, down = selected_devices(plan)
        for line in down:
            console.print(f"{line}: its devices are not in this campaign", highlight=False)
    matrix = plan
    plan = fleet_plan(matrix, devices)
    rec = kit.plan_record(plan)
    h = plan_hash(rec)
    part = str(shard) if shard is not None else None
    if c.targets is None and not fresh and shard is None and \
            store.find_resumable(root, c.name, h, with_failed=retry_failed) is None:
        again = _started_over(root, matrix, kit)  # a selector finding other devices now: resume over the first ones
        if again is not None:
            plan, devices = again
            rec = kit.plan_record(plan)
            h = plan_hash(rec)
            console.print(f"resuming over the devices this campaign started with: {', '.join(plan.fleet.devices)}",
                          highlight=False)
    plan = shard_plan(plan, shard)  # its share of the runs; the record and the hash stay the whole plan's
    grace = c.fleet.device_grace_s if c.fleet is not None else DEFAULT_GRACE_S
    state: dict = {"folder": None, "m": None}
    members = [device_opener(plan, d, kit.resolve_inputs, lambda: (state["folder"], state["m"]), make_target)
               for d in devices]
    lock: store.FolderLock | None = None
    try:
        with store.campaign_lock(root, c.name):
            stale = store.clear_stale_starts(root, c.name)
            folder = None if fresh else store.find_resumable(root, c.name, h, with_failed=retry_failed, shard=part)
            m: Manifest | None = None
            if folder is not None:
                lock = store.lock_folder(folder)
                m = load_manifest(folder)
                kit.refuse_unhashed(folder, m)
                state.update(folder=folder, m=m)
            opened, why = open_all(members)
            for label, reason in why.items():
                console.print(f"{label}: cannot be used now: {reason}; its runs wait up to {grace:g} s for it",
                              highlight=False)
            if not opened:
                raise UserError(f"{c.source}: no device of the fleet can be used: "
                                + "; ".join(f"{k}: {v}" for k, v in why.items()))
            _same_kind(plan, opened)
            now = time.time()
            if folder is None:
                if not fresh:
                    kit.note_other_plans(root, plan, h, console)
                first = opened[next(d.label for d in devices if d.label in opened)]
                m = kit.new_manifest(plan, rec, {"kind": first.target.kind}, first.res, now)
                if part is not None:
                    m.shard = part
                m.provenance = campaign_provenance(plan, first.target, first.res, first.desc)
                folder = folder_setup.create(root, plan, m, now)
                lock = store.lock_folder(folder)
                state.update(folder=folder, m=m)
                n = len(plan.cells) // (len(devices) if use_of(plan) == "compare" else 1)
                console.print(f"campaign {c.name}: {n} cells x {rec.repeats} repeats"
                              f"{f' ({tries_text(rec.replicate)})' if rec.replicate else ''}, {use_of(plan)} on "
                              f"{len(devices)} devices = {len(plan.runs)} runs -> {folder}"
                              f"{' (removed a half-made start: ' + ', '.join(stale) + ')' if stale else ''}",
                              highlight=False)
            else:
                assert m is not None
                folder_setup.reopen(folder, m, c.name, retry_failed, console)
            for label, s in list(opened.items()):
                bad = version_mismatch(m, s.res, label)
                if bad is not None:
                    console.print(f"{label}: not used: {bad}", highlight=False)
                    del opened[label]
        folder_setup.start_session(folder, m, now, kit.git_commit(Path.cwd()))
        with preparing(folder, c.prepare, console) as prep:  # every device prepared is restored however it ends
            return run_fleet(plan, m, folder, members, console, grace_s=grace, opened=opened, poll_s=poll_s,
                             live=console.is_terminal, on_open=prep.ensure if prep is not None else None)
    finally:
        if lock is not None:
            lock.release()


def _started_over(root: Path, matrix: Plan, kit: Kit) -> tuple[Plan, list[FleetDevice]] | None:
    """The newest unfinished folder of this selector campaign whose plan, over the devices it recorded, is this
    campaign's: (that plan, those devices)."""
    for d, _ in reversed(store.unfinished_elsewhere(root, matrix.campaign.name, "")):
        m = load_manifest(d)
        f = m.campaign.fleet
        if f is None or f.servers is None:
            continue
        devs = []
        for label in f.devices:
            serial, _, server = label.rpartition("@")
            devs.append(FleetDevice(label, serial, *parse_server(server)))
        p = fleet_plan(matrix, devs)
        if plan_hash(kit.plan_record(p)) == m.plan_hash:
            return p, devs
    return None


def _same_kind(plan: Plan, opened: dict[str, TargetSession]) -> None:
    """spread pools runs of several devices: they must be of one kind (the same model, as described)."""
    if use_of(plan) != "spread":
        return
    kinds = {label: s.desc.get("model") for label, s in opened.items()}
    if len(set(kinds.values())) > 1:
        listing = ", ".join(f"{k}: {v or 'no model'}" for k, v in kinds.items())
        raise UserError(f"{plan.campaign.source}: fleet.use spread shares runs among devices of one kind, these "
                        f"differ ({listing}); use compare, or select one model (fleet.match.model)")
