"""The journal of a device's preparation (`prepared/<device>.json` in a campaign folder): what a campaign's `prepare:`
changed on one adb device and the value each had before, written BEFORE the change, so a campaign interrupted or a
host that died can put the device back (`bmoe-bench run` again on the folder, or `bmoe-bench devices --restore
FOLDER`). Its state is `applying` (written before the first change), `applied`, then `restored` once every item
was put back: the file stays as the record of what preparation did (findings.md shows it).

A journal is read as untrusted: every value that becomes a shell argument on restore is one of a few known settings
and matches a strict pattern (`Item`'s types), and the file's size and nesting are bounded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, ValidationError, model_validator

from harness.errors import UserError
from harness.formats.files import atomic_write_json
from harness.formats.folder_guard import read_json, shown
from harness.formats.record import Record, problem

FORMAT = "bmoe-prepared"
VERSION = 1
DIR = "prepared"
MAX_BYTES = 256 * 1024


def _pattern(rx: str, what: str):
    compiled = re.compile(rx)

    def check(v: str) -> str:
        if not compiled.fullmatch(v):
            raise ValueError(f"{shown(v, 40)} is not {what}")
        return v
    return AfterValidator(check)


Serial = Annotated[str, _pattern(r"[A-Za-z0-9][A-Za-z0-9._:@\[\]-]{0,99}", "an adb serial")]
Server = Annotated[str, _pattern(r"(\[[0-9A-Fa-f:.]{2,45}\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252}):[0-9]{1,5}",
                                 "an adb server's host:port")]
Governor = Annotated[str, _pattern(r"[a-z][a-z0-9_]{0,31}", "a cpufreq governor's name")]
PolicyName = Annotated[str, _pattern(r"policy[0-9]{1,4}", "a cpufreq policy (policyN)")]
StayOn = Annotated[str, _pattern(r"null|[0-9]{1,2}", "a stay_on_while_plugged_in value (0-15, or null)")]
Mask = Annotated[str, _pattern(r"[0-9a-f]{1,256}", "a hexadecimal CPU mask")]
Stamp = Annotated[str, _pattern(r"[0-9T:.+Z-]{10,40}", "a time stamp")]


class StayOnItem(Record):
    """Settings.Global stay_on_while_plugged_in: set by `svc power stayon true`, put back by `settings put`."""

    kind: Literal["stay_on"]
    original: StayOn
    applied: StayOn


class ScreenItem(Record):
    """The screen turned off (`input keyevent KEYCODE_SLEEP`); woken after (KEYCODE_WAKEUP) as it was awake."""

    kind: Literal["screen"]
    original: Literal["awake"]
    applied: Literal["asleep"]


class BatteryItem(Record):
    """`dumpsys battery unplug` (its state was live, not frozen, before); `dumpsys battery reset` after."""

    kind: Literal["battery"]
    original: Literal["live"]
    applied: Literal["unplugged"]


class GovernorItem(Record):
    """One cpufreq policy's scaling_governor."""

    kind: Literal["governor"]
    policy: PolicyName
    original: Governor
    applied: Governor


Item = Annotated[StayOnItem | ScreenItem | BatteryItem | GovernorItem, Field(discriminator="kind")]


class Pin(Record):
    """Where the engine runs: `taskset MASK` (or `toybox taskset MASK`) in front of its command line."""

    cpus: list[Annotated[int, Field(ge=0, le=4095)]] = Field(max_length=4096)
    mask: Mask
    command: list[Literal["taskset", "toybox"] | Mask] = Field(min_length=2, max_length=3)
    policies: list[PolicyName] = Field(max_length=256)

    @model_validator(mode="after")
    def _command(self) -> Pin:
        if self.command not in (["taskset", self.mask], ["toybox", "taskset", self.mask]):
            raise ValueError(f"command {self.command} is not taskset {self.mask} or toybox taskset {self.mask}")
        return self


class Journal(Record):
    format: Literal["bmoe-prepared"]
    version: Literal[1]
    serial: Serial
    server: Server
    state: Literal["applying", "applied", "restored"]
    created: Stamp
    restored: Stamp | None = None
    items: list[Item] = Field(max_length=300)  # what was (or is about to be) changed, in the order applied
    charger: Literal["leave", "unplug"]  # the campaign's choice
    charger_seen: Literal["ac", "usb", "wireless", "dock"] | None = None  # plugged in before (None: on battery)
    battery_level: int | None = Field(None, ge=0, le=100)  # at the start
    governors: dict[PolicyName, Governor] = Field(default_factory=dict, max_length=256)  # in force at the start
    pin: Pin | None = None
    notes: list[Annotated[str, Field(max_length=300)]] = Field(default_factory=list, max_length=20)
    governor_refused: str | None = Field(None, max_length=2000)  # the governor asked could not be set: why, in force

    def summary(self, refused: bool = True) -> str:
        """One line: what preparation did on this device (`refused`: with the governor it could not set)."""
        parts: list[str] = []
        for it in self.items:
            if isinstance(it, StayOnItem):
                parts.append(f"stay awake (stay_on {it.original} -> {it.applied})")
            elif isinstance(it, ScreenItem):
                parts.append("screen off")
            elif isinstance(it, BatteryItem):
                parts.append("on battery (dumpsys battery unplug)")
        if self.charger == "leave":
            parts.append(f"charger left as it was ({self.charger_seen or 'none plugged in'})")
        if self.battery_level is not None:
            parts.append(f"battery {self.battery_level}% at the start")
        if self.pin is not None:
            parts.append(f"engine pinned to cpu {cpu_list(self.pin.cpus)} ({' '.join(self.pin.command)})")
        govs = [it for it in self.items if isinstance(it, GovernorItem)]
        if govs:
            parts.append("governor " + ", ".join(f"{g.policy} {g.original} -> {g.applied}" for g in govs))
        elif self.governors:
            parts.append("governor in force " + ", ".join(f"{k} {v}" for k, v in self.governors.items()))
        parts += self.notes + ([self.governor_refused] if refused and self.governor_refused else [])
        return "; ".join(parts) + f" [{self.state}]"


def cpu_list(cpus: list[int] | tuple[int, ...]) -> str:
    """[4, 5, 6, 7, 9] -> "4-7,9"."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def file_name(serial: str) -> str:
    """The journal's file name for a device: its serial with anything but letters, digits, . _ - as _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", serial) + ".json"


def journal_path(folder: Path, serial: str) -> Path:
    return Path(folder) / DIR / file_name(serial)


def save(folder: Path, j: Journal) -> Path:
    """Write the journal (atomically, synced) under folder/prepared/."""
    p = journal_path(folder, j.serial)
    if p.parent.is_symlink() or p.is_symlink():
        raise UserError(f"{p.parent if p.parent.is_symlink() else p}: a symbolic link; a campaign folder holds only "
                        f"plain files and folders (a link could make bmoe-bench write outside it): remove it")
    p.parent.mkdir(exist_ok=True)
    atomic_write_json(p, j.model_dump(mode="json"))
    return p


def load(path: Path) -> Journal:
    """A journal, validated (UserError naming the file and the first problem)."""
    obj = read_json(Path(path), MAX_BYTES)
    try:
        j = Journal.model_validate(obj)
    except ValidationError as e:
        raise UserError(f"{path}: not a device-preparation journal bmoe-bench wrote ({problem(e)}); "
                        f"restore that device by hand") from None
    if Path(path).name != file_name(j.serial):
        raise UserError(f"{path}: it names device {j.serial}, whose journal is {file_name(j.serial)}; "
                        f"restore that device by hand")
    return j


def journals(folder: Path) -> list[Path]:
    """The journal files of a folder, sorted (none when it has no prepared/)."""
    d = Path(folder) / DIR
    if not d.is_dir() or d.is_symlink():
        return []
    return sorted(p for p in d.iterdir() if p.suffix == ".json" and not p.name.startswith("."))
