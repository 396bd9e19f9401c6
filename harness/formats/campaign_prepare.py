"""A campaign's `prepare:` key (harness.formats.campaign): how each adb device of the campaign is prepared before its
runs and restored after them (stay awake or screen off, a battery minimum and the charger, the engine pinned to the
fastest cores, the CPU governor). What is applied and put back is harness.campaigns.prepared's; what was changed is
journalled in the folder (harness.formats.prepared) before it is changed."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.formats.campaign_types import _check

# a cpufreq governor's name as the kernel spells them (performance, schedutil, walt...)
GovernorName = Annotated[str, _check(r"[a-z][a-z0-9_]{0,31}", "{v!r} is not a cpufreq governor's name (e.g. "
                                                               "performance, schedutil)")]


class PrepareSpec(BaseModel):
    """Each item is applied to every adb device of the campaign before its runs and put back after them."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    screen: Literal["leave", "stay_awake", "turn_off"] = Field("leave", description=(
        "stay_awake: `svc power stayon true` (awake while plugged in); turn_off: the screen turned off "
        "(`input keyevent KEYCODE_SLEEP`); leave: untouched. The setting in force before is put back after"))
    battery_min_pct: int | None = Field(None, ge=1, le=100, description=(
        "refuse to start a device whose battery is below this level (after waiting battery_wait_s for it)"))
    battery_wait_s: float = Field(0.0, ge=0, le=86_400, description=(
        "with battery_min_pct: how long to wait for a charging device to reach it before refusing"))
    charger: Literal["leave", "unplug"] = Field("leave", description=(
        "unplug: `dumpsys battery unplug`, so the device runs on battery as a user's would (`dumpsys battery reset` "
        "after); leave: charging as it is. The choice and the charger seen are recorded in the folder"))
    pin_cores: int | None = Field(None, ge=1, le=1024, description=(
        "run the engine on this many of the fastest cores (cpufreq policies by cpuinfo_max_freq, fastest first) "
        "with `taskset MASK` in front of its command line; recorded per run"))
    governor: GovernorName | None = Field(None, description=(
        "the cpufreq governor set on the pinned cores' policies (every policy without pin_cores), e.g. "
        "performance; needs root: where it cannot be set, the governor in force is recorded and one line says so"))

    def active(self) -> bool:
        """Anything to do on a device."""
        return (self.screen != "leave" or self.battery_min_pct is not None or self.charger != "leave"
                or self.pin_cores is not None or self.governor is not None)

    def problems(self, adb: bool) -> list[tuple[tuple[str, ...], str]]:
        """The rules between this key and the campaign's target: (location, message) each."""
        out: list[tuple[tuple[str, ...], str]] = []
        if not adb and self.active():
            out.append((("prepare",), "prepare applies to adb devices (target adb, or a fleet): remove it"))
        if self.screen == "stay_awake" and self.charger == "unplug":
            out.append((("prepare", "screen"), "prepare.screen stay_awake keeps a device awake only while Android "
                                               "counts it as plugged in, which charger: unplug stops; use screen: "
                                               "turn_off, or charger: leave"))
        if self.battery_wait_s and self.battery_min_pct is None:
            out.append((("prepare", "battery_wait_s"), "prepare.battery_wait_s waits for battery_min_pct: set it"))
        return out
