"""The layouts a test device profile (tests/helpers/device_profile.py) is made from: its cpufreq policies, thermal
zones, battery and screen, and the phones the tests use."""

from __future__ import annotations

from dataclasses import dataclass

GOVERNORS = ("schedutil", "performance", "powersave", "userspace", "ondemand")


@dataclass(frozen=True)
class Policy:
    """A cpufreq policy: the cpus it drives and its frequencies in kHz."""

    cpus: tuple[int, ...]
    max_khz: int
    min_khz: int = 300_000
    governor: str = "schedutil"

    @property
    def name(self) -> str:
        return f"policy{self.cpus[0]}"


@dataclass(frozen=True)
class Zone:
    """A thermal zone: its type (Android-like names) and its temperature in degrees C."""

    type: str
    temp_c: float


@dataclass(frozen=True)
class Layout:
    policies: tuple[Policy, ...]
    zones: tuple[Zone, ...]
    battery_level: int = 80
    charger: str | None = "usb"  # ac | usb | wireless | dock | None (on battery)
    battery_temp_c: float = 28.0
    screen_on: bool = True


# A phone like a Snapdragon 8 Gen 2: little 0-3 at 1.8 GHz, mid 4-6 at 2.4 GHz, big 7 at 3.0 GHz.
PHONE = Layout(
    policies=(Policy((0, 1, 2, 3), 1_804_800), Policy((4, 5, 6), 2_419_200), Policy((7,), 3_014_400)),
    zones=(Zone("cpu-0-0", 35.0), Zone("cpu-1-0", 36.0), Zone("cpu-1-3", 37.5), Zone("cpuss-0", 34.0),
           Zone("gpuss-0", 33.0), Zone("battery", 28.0), Zone("skin-therm", 31.0)),
)

# A phone of two cores, little 0 at 1.8 GHz and big 1 at 3.0 GHz: the test VM has two cpus, so a process pinned to
# this phone's fastest core (taskset 2) really runs there.
DUO = Layout(
    policies=(Policy((0,), 1_804_800), Policy((1,), 3_014_400)),
    zones=(Zone("cpu-0-0", 35.0), Zone("cpu-1-0", 37.5), Zone("battery", 28.0), Zone("skin-therm", 31.0)),
)

# Another phone, for tests that need two that differ: 2 policies (0-5, 6-7), other zone names, on battery.
PHONE_B = Layout(
    policies=(Policy((0, 1, 2, 3, 4, 5), 2_000_000), Policy((6, 7), 2_850_000, governor="performance")),
    zones=(Zone("cpu_big0", 41.0), Zone("cpu_little0", 39.0), Zone("battery", 30.5), Zone("skin-therm", 33.0)),
    battery_level=55,
    charger=None,
    battery_temp_c=30.5,
)
