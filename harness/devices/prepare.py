"""What a campaign's device preparation reads and changes on an adb device, through its shell (harness.devices.remote):

    observe(dev)              the settings preparation may change, as they are now (`Observed`)
    pin_command(dev, mask)    `taskset MASK` or `toybox taskset MASK`, whichever the device runs; None if neither
    apply(dev, item)          make one journal item's change (harness.formats.prepared); UserError when it fails
    set_governor(dev, ...)    write one policy's governor; False where the device refuses it (not root)
    restore(dev, item)        put one item back and read it back: None when it is as it was, else why not

Every command is built by sh_join from a journal item's validated fields (harness.formats.prepared), never from
free text. restore is idempotent: it sets the original value and checks it, whatever state the device is in."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harness.devices.cores import POLICY_SCRIPT, CpuPolicy, parse_policies
from harness.devices.parse import last_line
from harness.devices.remote import RemoteShell
from harness.devices.sh import script, sh_join
from harness.devices.state import parse_dumpsys_battery
from harness.errors import UserError
from harness.formats.prepared import BatteryItem, GovernorItem, Item, ScreenItem, StayOnItem

STAY_ON = ["global", "stay_on_while_plugged_in"]
WRITE_SCRIPT = 'echo "$1" > "$2"'  # $1 the value, $2 the sysfs file
_STAY = re.compile(r"null|[0-9]{1,2}")


def governor_file(policy: str) -> str:
    if not re.fullmatch(r"policy[0-9]{1,4}", policy):
        raise ValueError(f"{policy!r} is not a cpufreq policy")
    return f"/sys/devices/system/cpu/cpufreq/{policy}/scaling_governor"


@dataclass
class Observed:
    """A device's state as preparation reads it (None: the device could not tell)."""

    stay_on: str | None = None  # Settings.Global stay_on_while_plugged_in: "0".."15" or "null"
    awake: bool | None = None  # dumpsys power: mWakefulness=Awake
    battery: dict | None = None  # harness.devices.state.parse_dumpsys_battery
    battery_frozen: bool = False  # `dumpsys battery unplug|set` in force (UPDATES STOPPED)
    policies: list[CpuPolicy] = field(default_factory=list)


def _out(dev: RemoteShell, words: list[str]) -> str | None:
    """stdout of a command, None when it fails (absent tool, refused)."""
    code, out, _ = dev.shell(sh_join(words))
    return out if code == 0 else None


def read_stay_on(dev: RemoteShell) -> str | None:
    out = _out(dev, ["settings", "get", *STAY_ON])
    v = out.strip() if out is not None else ""
    return v if _STAY.fullmatch(v) else None


def read_awake(dev: RemoteShell) -> bool | None:
    m = re.search(r"^\s*mWakefulness=(\w+)", _out(dev, ["dumpsys", "power"]) or "", re.M)
    return None if m is None else m[1] == "Awake"


def read_battery(dev: RemoteShell) -> tuple[dict | None, bool]:
    """(dumpsys battery's values, whether its updates are stopped)."""
    text = _out(dev, ["dumpsys", "battery"]) or ""
    return parse_dumpsys_battery(text), "UPDATES STOPPED" in text


def read_governor(dev: RemoteShell, policy: str) -> str | None:
    out = _out(dev, ["cat", governor_file(policy)])
    return out.strip() if out is not None else None


def observe(dev: RemoteShell) -> Observed:
    battery, frozen = read_battery(dev)
    code, out, _ = dev.shell(script(POLICY_SCRIPT))
    return Observed(stay_on=read_stay_on(dev), awake=read_awake(dev), battery=battery, battery_frozen=frozen,
                    policies=parse_policies(out) if code == 0 else [])


def pin_command(dev: RemoteShell, mask: str) -> list[str] | None:
    """The words to put in front of the engine's command line to run it on `mask`'s cpus: `taskset MASK` (Linux,
    Android's toybox applet) or `toybox taskset MASK`, tried with `true`; None when neither runs there."""
    for words in (["taskset", mask], ["toybox", "taskset", mask]):
        code, _, _ = dev.shell(sh_join([*words, "true"]))
        if code == 0:
            return words
    return None


def _must(dev: RemoteShell, words: list[str], what: str) -> None:
    code, out, err = dev.shell(sh_join(words))
    if code != 0:
        raise UserError(f"adb device {dev.serial}: cannot {what} (`{' '.join(words)}`: "
                        f"{last_line(err or out) or f'exit {code}'})")


def apply(dev: RemoteShell, item: Item) -> None:
    """Make the item's change; UserError naming the device and the command when it fails."""
    if isinstance(item, StayOnItem):
        _must(dev, ["svc", "power", "stayon", "true"], "keep it awake")
    elif isinstance(item, ScreenItem):
        _must(dev, ["input", "keyevent", "KEYCODE_SLEEP"], "turn its screen off")
    elif isinstance(item, BatteryItem):
        _must(dev, ["dumpsys", "battery", "unplug"], "run it on battery")
    elif isinstance(item, GovernorItem):
        set_governor(dev, item.policy, item.applied)


def set_governor(dev: RemoteShell, policy: str, governor: str) -> bool:
    """Write the governor and read it back: True when it took (root), False where the device refused it."""
    dev.shell(script(WRITE_SCRIPT, governor, governor_file(policy)))
    return read_governor(dev, policy) == governor


def restore(dev: RemoteShell, item: Item) -> str | None:
    """Put the item's setting back as it was and read it back: None when it is, else one line saying what is left."""
    if isinstance(item, StayOnItem):
        words = ["settings", "delete", *STAY_ON] if item.original == "null" else \
            ["settings", "put", *STAY_ON, item.original]
        dev.shell(sh_join(words))
        now = read_stay_on(dev)
        return None if now == item.original or (item.original == "null" and now in ("null", "0")) else \
            f"stay_on_while_plugged_in is {now}, was {item.original}"
    if isinstance(item, ScreenItem):
        if read_awake(dev) is not True:
            dev.shell(sh_join(["input", "keyevent", "KEYCODE_WAKEUP"]))
        return None if read_awake(dev) is True else "its screen is still off"
    if isinstance(item, BatteryItem):
        dev.shell(sh_join(["dumpsys", "battery", "reset"]))
        return None if not read_battery(dev)[1] else "its battery service is still unplugged (dumpsys battery reset)"
    if isinstance(item, GovernorItem):
        if read_governor(dev, item.policy) == item.original or set_governor(dev, item.policy, item.original):
            return None
        return f"{item.policy}'s governor is {read_governor(dev, item.policy)}, was {item.original}"
    raise AssertionError(item)
