"""`bmoe-bench check` on a folder whose runs ran on several devices (a fleet, or shards merged from several
machines): each device's fingerprint and state, not only the first one's. Pure: the manifest in, lines out.

For every device a finished run names (and every device the manifest describes):
- its description (the manifest's `devices`: what the device said it was when it was opened) is recorded;
- its fingerprint (provenance.devices) is complete as one target's is (adb: the build fingerprint, SoC, Android
  version and RAM; otherwise the CPU model and kernel) and agrees with its description on the fields both read
  from the same source (kernel, RAM, CPU model; adb: build fingerprint and Android version);
- its storage is recorded (harness.formats.storage);
- its state: each ok run's entry state (the sample that passed the cooldown gate, read on the device the run
  ran on) shows that device's RAM (within RAM_TOLERANCE): a run recorded on another device than the one it ran
  on, or a device's record edited, is caught here.

A folder from before provenance.devices passes with a note: each device's fingerprint is read from its
description instead (what it reported then), and its storage is unknown."""

from __future__ import annotations

from typing import Any

from harness.formats.manifest import DeviceFingerprint, Manifest

RAM_TOLERANCE = 0.01  # MemTotal does not change while a device runs; 1% absorbs rounding, not another device


def labels_of(m: Manifest) -> list[str]:
    """The devices of the folder: the fleet's order first, then any other described or run on."""
    out: list[str] = list(m.campaign.fleet.devices) if m.campaign.fleet is not None else []
    named = list(m.devices or {}) + [r.device for r in m.runs if r.finished and r.device]
    return out + [d for d in dict.fromkeys(named) if d not in out]


def several(m: Manifest) -> bool:
    """True when the folder's runs ran on several devices (its checks are this module's)."""
    return bool(m.devices) or any(r.device for r in m.runs)


def fingerprint_of(desc: dict[str, Any]) -> DeviceFingerprint:
    """A device's fingerprint as its description states it (harness.campaigns.provenance.device_fingerprint reads the
    same sources)."""
    kind = desc.get("kind") if desc.get("kind") in ("adb", "ssh", "local") else "local"

    def s(k: str) -> str | None:
        v = desc.get(k)
        return str(v) if isinstance(v, str | int | float) and not isinstance(v, bool) and str(v) else None

    mem = desc.get("mem_total_mib")
    mem = float(mem) if isinstance(mem, int | float) and not isinstance(mem, bool) else None
    if kind == "local":
        return DeviceFingerprint(kind="local", cpu_model=s("cpu_model"), kernel=s("kernel"), mem_total_mib=mem)
    return DeviceFingerprint(kind=kind, fingerprint=s("fingerprint") if kind == "adb" else None, soc=s("platform"),
                             android=s("android_release"), cpu_model=s("hardware"), kernel=s("kernel"),
                             mem_total_mib=mem)


def gaps(fp: DeviceFingerprint) -> list[str]:
    """The fields a fingerprint of its kind must have and lacks."""
    need = ("fingerprint", "soc", "android", "mem_total_mib") if fp.kind == "adb" else ("cpu_model", "kernel")
    return [f for f in need if getattr(fp, f) is None]


def _disagree(fp: DeviceFingerprint, desc: DeviceFingerprint) -> list[str]:
    fields = ["kernel", "cpu_model", "mem_total_mib"] + (["fingerprint", "android"] if fp.kind == "adb" else [])
    return [f"{f} {getattr(fp, f)!r}, its description {getattr(desc, f)!r}" for f in fields
            if getattr(fp, f) != getattr(desc, f)]


def check_devices(m: Manifest) -> tuple[list[str], list[str]]:
    """(problems, notes) of each device's fingerprint and state; nothing for a folder on one target."""
    if not several(m) or m.provenance is None:
        return [], []
    pv = m.provenance
    recorded = pv.devices
    out: list[str] = []
    notes = [] if recorded is not None else [
        "provenance: the devices' own fingerprints and storage were not recorded (a folder from before "
        "provenance.devices): each device's fingerprint is read from its description, its storage is unknown"]
    known = m.devices or {}
    ran = {r.device for r in m.runs if r.finished and r.device}
    fps: dict[str, DeviceFingerprint] = {}
    for label in labels_of(m):
        desc = known.get(label)
        if desc is None:
            if label in ran:
                out.append(f"device {label}: runs ran on it but its description is not recorded (manifest devices)")
            continue
        said = fingerprint_of(desc)
        if recorded is None:
            fp = said
        elif label not in recorded:
            out.append(f"provenance: device {label}: no fingerprint recorded (provenance.devices)")
            continue
        else:
            fp = recorded[label].fingerprint
            out += [f"provenance: device {label}: its fingerprint says {d} (the device changed since it was first "
                    f"opened, or a record was edited)" for d in _disagree(fp, said)]
            if recorded[label].storage is None:
                out.append(f"provenance: device {label}: no storage recorded")
        fps[label] = fp
        lack = gaps(fp)
        if lack:
            out.append(f"provenance: device {label}: fingerprint lacks {', '.join(lack)}")
    for label in sorted(set(recorded or {}) - set(labels_of(m))):
        out.append(f"provenance: device {label} has a fingerprint but the folder names no such device")
    return out + _states(m, fps), notes


def _states(m: Manifest, fps: dict[str, DeviceFingerprint]) -> list[str]:
    """Each ok run's entry state against the RAM of the device its record names."""
    out = []
    for r in m.runs:
        if r.status != "ok" or not r.device or r.device not in fps:
            continue
        want, have = fps[r.device].mem_total_mib, r.entry_state.mem_total_mib if r.entry_state else None
        if want and have and abs(have - want) > RAM_TOLERANCE * want:
            out.append(f"run {r.run_id} on device {r.device}: its entry state shows {have:.0f} MiB of RAM, device "
                       f"{r.device} has {want:.0f} MiB: the run did not run on the device its record names")
    return out
