"""A device profile for the adbd test devices: sysfs thermal zones and cpufreq policies, a battery, Android's
thermal status, Doze and the stay-awake setting, as files a test heats, throttles, cools and reads back.

`DeviceProfile.create(dir, layout)` writes the tree; `start_device(profile, port)` starts a real adbd in a
mount namespace of its own where tests/adbd/device-profile.sh has bind-mounted the profile over
/sys/class/thermal and /sys/devices/system/cpu/cpufreq and put the profile's dumpsys, svc, settings, cmd and input
(tests/adbd/profile-bin/) first on the shell's PATH. The test's own namespace (and the host) keep their /sys:
only that device sees the profile, so every device can have its own, and the main loopback device of
tests/adbd/netns-session.sh stays the plain Linux it always was unless BMOE_TEST_DEVICE_PROFILE names one.

The tree (PROFILE/):
  sys/class/thermal/thermal_zoneN/{type,temp}                     temp in millidegrees C
  sys/devices/system/cpu/cpufreq/policyN/{related_cpus,affected_cpus,cpuinfo_min_freq,cpuinfo_max_freq,
      scaling_min_freq,scaling_max_freq,scaling_cur_freq,scaling_governor,scaling_available_governors,
      scaling_available_frequencies}                              kHz, as the kernel's
  system/bin/{dumpsys,svc,settings,cmd,input}                     copies of tests/adbd/profile-bin/
  state/battery/KEY             the hardware's battery (ac usb wireless dock: true/false; level status health
                                temp voltage counter max_charging_current max_charging_voltage present technology)
  state/battery.frozen/KEY      what `dumpsys battery unplug|set` froze; absent when not frozen (`reset`)
  state/thermal/hal_status      the thermal HAL's severity (0 none .. 6 shutdown), state/thermal/override_status
                                what `cmd thermalservice override-status` forced (absent: no override)
  state/deviceidle/{force,state,light_state}   written by `dumpsys deviceidle force-idle`, removed by `unforce`
  state/power/screen_on         true/false
  state/dumpsys_delay_s         every dumpsys sleeps this long first (absent: none)
  state/settings/NS/KEY         `settings get/put NS KEY`; `svc power stayon` writes global/stay_on_while_plugged_in
  layout.json                   the Layout it was made from (DeviceProfile.open reads it)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.device_layouts import DUO, GOVERNORS, PHONE, PHONE_B, Layout, Policy, Zone  # noqa: F401

ADBD_DIR = Path(__file__).resolve().parent.parent / "adbd"
LAYER = ADBD_DIR / "device-profile.sh"
BIN = ADBD_DIR / "profile-bin"

_CHARGERS = ("ac", "usb", "wireless", "dock")
# BatteryManager: BATTERY_STATUS_CHARGING 2, DISCHARGING 3; BATTERY_HEALTH_GOOD 2
_STATUS_CHARGING, _STATUS_DISCHARGING = 2, 3


def _write(p: Path, value: object) -> None:
    """Replace the file whole (a new inode renamed over it), so a device reading it while a test changes it
    reads the old value or the new one, never an empty file."""
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(f"{value}\n")
    os.replace(tmp, p)


def _read(p: Path) -> str | None:
    try:
        return p.read_text().strip()
    except FileNotFoundError:
        return None


@dataclass
class DeviceProfile:
    root: Path
    layout: Layout = field(default=PHONE)

    # ---- making one ------------------------------------------------------------------------------

    @classmethod
    def create(cls, root: Path, layout: Layout = PHONE) -> DeviceProfile:
        """Write a profile for `layout` under root (made; must not hold a profile already)."""
        root.mkdir(parents=True, exist_ok=True)
        if (root / "sys").exists():
            raise FileExistsError(f"{root} already holds a profile")
        p = cls(root, layout)
        p.thermal_dir.mkdir(parents=True)
        for i, z in enumerate(layout.zones):
            _write(p.thermal_dir / f"thermal_zone{i}" / "type", z.type)
            _write(p.thermal_dir / f"thermal_zone{i}" / "temp", round(z.temp_c * 1000))
        p.cpufreq_dir.mkdir(parents=True)
        for pol in layout.policies:
            d = p.cpufreq_dir / pol.name
            cpus = " ".join(map(str, pol.cpus))
            freqs = sorted({pol.min_khz, pol.max_khz // 2 // 100 * 100, pol.max_khz})
            for name, value in (("related_cpus", cpus), ("affected_cpus", cpus),
                                ("cpuinfo_min_freq", pol.min_khz), ("cpuinfo_max_freq", pol.max_khz),
                                ("scaling_min_freq", pol.min_khz), ("scaling_max_freq", pol.max_khz),
                                ("scaling_cur_freq", pol.max_khz), ("scaling_governor", pol.governor),
                                ("scaling_available_governors", " ".join(GOVERNORS)),
                                ("scaling_available_frequencies", " ".join(map(str, freqs)))):
                _write(d / name, value)
        p.bin_dir.mkdir(parents=True)
        for tool in BIN.iterdir():
            shutil.copy2(tool, p.bin_dir / tool.name)
        p.set_battery(level=layout.battery_level, charger=layout.charger, temp_c=layout.battery_temp_c,
                      _initial=True)
        _write(p.state / "thermal" / "hal_status", 0)
        _write(p.state / "power" / "screen_on", "true" if layout.screen_on else "false")
        _write(p.state / "settings" / "global" / "stay_on_while_plugged_in", 0)
        (p.state / "deviceidle").mkdir(parents=True)
        (root / "layout.json").write_text(json.dumps(dataclasses.asdict(layout), indent=1) + "\n")
        return p

    @classmethod
    def open(cls, root: Path) -> DeviceProfile:
        """A profile written before (by create, or `python -m tests.helpers.device_profile DIR`)."""
        d = json.loads((root / "layout.json").read_text())
        layout = Layout(**{**d, "policies": tuple(Policy(**{**p, "cpus": tuple(p["cpus"])}) for p in d["policies"]),
                           "zones": tuple(Zone(**z) for z in d["zones"])})
        return cls(root, layout)

    @property
    def thermal_dir(self) -> Path:
        return self.root / "sys/class/thermal"

    @property
    def cpufreq_dir(self) -> Path:
        return self.root / "sys/devices/system/cpu/cpufreq"

    @property
    def bin_dir(self) -> Path:
        return self.root / "system/bin"

    @property
    def state(self) -> Path:
        return self.root / "state"

    # ---- thermal ---------------------------------------------------------------------------------

    def zones(self) -> dict[str, Path]:
        """{zone type: its dir} in zone order."""
        out = {}
        for d in sorted(self.thermal_dir.glob("thermal_zone*"), key=lambda p: int(p.name[12:])):
            out[(d / "type").read_text().strip()] = d
        return out

    def cpu_zones(self) -> list[str]:
        return [t for t in self.zones() if t.startswith(("cpu", "cluster", "big", "mid", "little"))]

    def temps(self) -> dict[str, float]:
        """{zone type: degrees C} as the files say now."""
        return {t: int((d / "temp").read_text()) / 1000 for t, d in self.zones().items()}

    def set_temp(self, zone_type: str, celsius: float) -> None:
        zones = self.zones()
        if zone_type not in zones:
            raise KeyError(f"no thermal zone of type {zone_type!r} (have {', '.join(zones)})")
        _write(zones[zone_type] / "temp", round(celsius * 1000))

    def heat(self, celsius: float, zones: list[str] | None = None) -> None:
        """The CPU zones (or `zones`) at `celsius`; the skin warms to a few degrees below."""
        for z in zones if zones is not None else self.cpu_zones():
            self.set_temp(z, celsius)
        if zones is None and "skin-therm" in self.zones():
            self.set_temp("skin-therm", max(self.temps()["skin-therm"], celsius - 15))

    def cool(self) -> None:
        """Every zone back at the layout's temperature; thermal status none; no policy capped."""
        for z in self.layout.zones:
            self.set_temp(z.type, z.temp_c)
        self.set_thermal_status(0)
        self.unthrottle()

    # ---- cpufreq ---------------------------------------------------------------------------------

    def policy_dir(self, policy: str | int) -> Path:
        d = self.cpufreq_dir / (policy if isinstance(policy, str) else f"policy{policy}")
        if not d.is_dir():
            raise KeyError(f"no cpufreq {d.name} (have {', '.join(p.name for p in self.layout.policies)})")
        return d

    def freq(self, policy: str | int) -> dict[str, int]:
        """{cpuinfo_max, scaling_max, scaling_cur, scaling_min} in kHz."""
        d = self.policy_dir(policy)
        return {k: int((d / f"{k}_freq").read_text()) for k in ("cpuinfo_max", "scaling_max", "scaling_cur",
                                                                  "scaling_min")}

    def throttle(self, policy: str | int, khz: int) -> None:
        """Cap the policy at khz, as a thermal governor does: scaling_max_freq below cpuinfo_max_freq and the
        current frequency under the cap."""
        d = self.policy_dir(policy)
        if not 0 < khz <= int((d / "cpuinfo_max_freq").read_text()):
            raise ValueError(f"{khz} kHz is outside {d.name}'s range")
        _write(d / "scaling_max_freq", khz)
        cur = int((d / "scaling_cur_freq").read_text())
        _write(d / "scaling_cur_freq", min(cur, khz))

    def unthrottle(self) -> None:
        for pol in self.layout.policies:
            d = self.policy_dir(pol.name)
            _write(d / "scaling_max_freq", pol.max_khz)
            _write(d / "scaling_cur_freq", pol.max_khz)

    def governor(self, policy: str | int) -> str:
        return (self.policy_dir(policy) / "scaling_governor").read_text().strip()

    def governors(self) -> dict[str, str]:
        return {p.name: self.governor(p.name) for p in self.layout.policies}

    # ---- Android's thermal status ----------------------------------------------------------------

    def set_thermal_status(self, status: int) -> None:
        """The HAL's severity (android.os.Temperature THROTTLING_NONE 0 .. SHUTDOWN 6), which `dumpsys
        thermalservice` reports as "Thermal Status" unless `cmd thermalservice override-status` forced one."""
        if not 0 <= status <= 6:
            raise ValueError(f"thermal status {status} is not 0..6")
        _write(self.state / "thermal" / "hal_status", status)

    def thermal_status(self) -> int:
        """What `dumpsys thermalservice` shows as "Thermal Status"."""
        forced = _read(self.state / "thermal" / "override_status")
        return int(forced if forced is not None else _read(self.state / "thermal" / "hal_status") or 0)

    def thermal_overridden(self) -> bool:
        return (self.state / "thermal" / "override_status").exists()

    def set_dumpsys_delay(self, seconds: float | None) -> None:
        """Every `dumpsys` waits this long before it answers (a phone whose system_server is slow); None: none."""
        if seconds is None:
            (self.state / "dumpsys_delay_s").unlink(missing_ok=True)
        else:
            _write(self.state / "dumpsys_delay_s", seconds)

    # ---- battery ---------------------------------------------------------------------------------

    def set_battery(self, *, level: int | None = None, charger: str | None | bool = False,
                    temp_c: float | None = None, _initial: bool = False) -> None:
        """What the battery hardware reports: its level, the charger plugged in (ac, usb, wireless, dock or
        None for none; False leaves it as it is) and its temperature. While `dumpsys battery unplug|set` has
        frozen the service's state, `dumpsys battery` keeps showing the frozen values, as Android does."""
        b = self.state / "battery"
        if _initial:
            for k, v in (("max_charging_current", 500000), ("max_charging_voltage", 5000000), ("health", 2),
                         ("present", "true"), ("voltage", 4012), ("technology", "Li-ion")):
                _write(b / k, v)
        if level is not None:
            if not 0 <= level <= 100:
                raise ValueError(f"battery level {level} is not 0..100")
            _write(b / "level", level)
            _write(b / "counter", level * 45_000)  # uAh of a 4500 mAh battery
        if charger is not False:
            if charger is not None and charger not in _CHARGERS:
                raise ValueError(f"charger {charger!r} is not one of {_CHARGERS} or None")
            for src in _CHARGERS:
                _write(b / src, "true" if src == charger else "false")
            _write(b / "status", _STATUS_CHARGING if charger else _STATUS_DISCHARGING)
        if temp_c is not None:
            _write(b / "temp", round(temp_c * 10))

    def battery(self) -> dict[str, str]:
        """The values `dumpsys battery` shows now (the frozen copy while updates are stopped)."""
        d = self.state / ("battery.frozen" if self.battery_frozen() else "battery")
        return {f.name: f.read_text().strip() for f in sorted(d.iterdir()) if not f.name.startswith(".")}

    def battery_frozen(self) -> bool:
        """`dumpsys battery unplug` or `set` is in force (not `reset`)."""
        return (self.state / "battery.frozen").is_dir()

    def battery_unplugged(self) -> bool:
        """The service says no charger while the hardware has one: `dumpsys battery unplug` is in force."""
        real = any(_read(self.state / "battery" / s) == "true" for s in _CHARGERS)
        shown = any(self.battery().get(s) == "true" for s in _CHARGERS)
        return self.battery_frozen() and real and not shown

    # ---- power, Doze, settings -------------------------------------------------------------------

    def setting(self, namespace: str, key: str) -> str | None:
        return _read(self.state / "settings" / namespace / key)

    def stay_on(self) -> int:
        """Settings.Global stay_on_while_plugged_in (0: off; 7: `svc power stayon true`)."""
        return int(self.setting("global", "stay_on_while_plugged_in") or 0)

    def screen_on(self) -> bool:
        return _read(self.state / "power" / "screen_on") == "true"

    def set_screen(self, on: bool) -> None:
        _write(self.state / "power" / "screen_on", "true" if on else "false")

    def idle_forced(self) -> bool:
        """`dumpsys deviceidle force-idle` in force (not `unforce`)."""
        return _read(self.state / "deviceidle" / "force") == "true"

    # ---- what a harness may change, to show it restored --------------------------------------------

    def snapshot(self) -> dict[str, object]:
        """Everything a campaign's device preparation may change: governors and frequency caps, stay-awake,
        the screen, the battery service's frozen state, Doze and a forced thermal status. Equal before and
        after a campaign = the device was restored."""
        return {
            "governors": self.governors(),
            "scaling_max_khz": {p.name: self.freq(p.name)["scaling_max"] for p in self.layout.policies},
            "scaling_min_khz": {p.name: self.freq(p.name)["scaling_min"] for p in self.layout.policies},
            "stay_on": self.stay_on(),
            "screen_on": self.screen_on(),
            "battery_frozen": self.battery_frozen(),
            "battery_shown": self.battery(),
            "idle_forced": self.idle_forced(),
            "thermal_override": _read(self.state / "thermal" / "override_status"),
        }


# ---- a device with a profile ------------------------------------------------------------------------


@dataclass
class ProfiledDevice:
    serial: str
    port: int
    profile: DeviceProfile
    proc: subprocess.Popen
    server_port: int | None = None

    def adb(self, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
        server = ["-P", str(self.server_port)] if self.server_port else []
        return subprocess.run([os.environ["BMOE_TEST_ADB"], *server, "-s", self.serial, *args],
                              capture_output=True, text=True, timeout=timeout)

    def shell(self, command: str, timeout: float = 20) -> str:
        """The device shell's stdout for `command`; raises on a non-zero exit."""
        r = self.adb("shell", command, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{self.serial}: `{command}` exit {r.returncode}: {r.stdout}{r.stderr}")
        return r.stdout

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.adb("disconnect", self.serial)


def start_device(profile: DeviceProfile, port: int, *, server_port: int | None = None,
                 data_mb: int = 64, rooted: bool = True) -> ProfiledDevice:
    """A real adbd on 127.0.0.1:port in its own mount namespace with `profile` laid over it (and its own tmpfs
    /data/local/tmp of data_mb MiB), connected to the adb server (the session's, or the one on server_port).
    rooted=False plays an unrooted phone: the device's shell cannot write the cpufreq files (a read-only mount; the
    test still can). Needs tests/adbd/run-adb-tests.sh's namespace (BMOE_TEST_ADBD, BMOE_TEST_ADB, only lo)."""
    launcher = os.environ["BMOE_TEST_ADBD"]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = {ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ":" in ln}
    assert names == {"lo"}, "refusing to start adbd: this network namespace has interfaces other than lo"
    env = {"ADBD_PORT": str(port), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/",
           "BMOE_PROFILE_DATA_MB": str(data_mb), "BMOE_PROFILE_UNROOTED": "0" if rooted else "1"}
    log = profile.root.parent / f"{profile.root.name}.adbd.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", str(LAYER),
                                 str(profile.root), launcher],
                                cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=fh, stderr=fh)
    dev = ProfiledDevice(f"127.0.0.1:{port}", port, profile, proc, server_port)
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"device-profile.sh exited {proc.returncode}: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() - t0 > 20:
                    raise TimeoutError(f"adbd on 127.0.0.1:{port} did not come up in 20 s") from None
                time.sleep(0.05)
        r = dev.adb("connect", dev.serial)
        if r.returncode != 0:
            raise RuntimeError(f"adb connect {dev.serial}: {r.stdout}{r.stderr}")
        dev.adb("wait-for-device")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    return dev


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.helpers.device_profile DIR [phone|phone-b]`: write a profile (for
    BMOE_TEST_DEVICE_PROFILE=DIR tests/adbd/run-adb-tests.sh, or by hand)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    layouts = {"phone": PHONE, "phone-b": PHONE_B, "duo": DUO}
    if len(args) not in (1, 2) or (len(args) == 2 and args[1] not in layouts):
        print("usage: python -m tests.helpers.device_profile DIR [phone|phone-b|duo]", file=sys.stderr)
        return 2
    DeviceProfile.create(Path(args[0]), layouts[args[1] if len(args) == 2 else "phone"])
    print(Path(args[0]).resolve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
