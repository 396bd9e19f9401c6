"""Device state: memory, thermal zones, cpufreq policies, battery and Android's thermal status, as one sample.

Pure parsers first, then two readers that feed them: `read_local(root)` reads a /proc + /sys tree from
this machine's filesystem (or a fixture tree), and `STATE_SCRIPT` is a constant POSIX sh script that
prints the same sources in one round trip on a device (`parse_state_dump` reads its output). Both end
in `build_sample`, so a local sample and an adb sample have the same shape: a
harness.formats.devstate.DeviceSample, handed on as its dict (what Target.sample_state returns).

A source that is missing (an empty sysfs in a VM, no dumpsys on a Linux adbd) is None or empty, never 0.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from harness.formats.devstate import DeviceSample

_MEMINFO_KEYS = {
    "MemTotal": "mem_total_mib",
    "MemAvailable": "mem_available_mib",
    "MemFree": "mem_free_mib",
    "Cached": "cached_mib",
    "SwapFree": "swap_free_mib",
}

# thermal zone types that measure a CPU (cluster, core or package) on common SoCs and PCs:
# Qualcomm cpu-0-0-usr / cpuss-0-usr / apc1-cpu0, MediaTek mtktscpu / cpu_big0, Exynos & Tensor BIG / MID /
# LITTLE, generic cpu_thermal / soc_thermal, x86 x86_pkg_temp / coretemp
_CPU_ZONE = re.compile(
    r"^(cpu|cpuss|apc\d|mtktscpu|soc[-_]?therm|soc_thermal|x86_pkg_temp|coretemp|big|mid|little|cluster)",
    re.IGNORECASE,
)


def parse_meminfo(text: str) -> dict[str, float | None]:
    """The /proc/meminfo fields we record, in MiB (kB / 1024), None where absent."""
    out: dict[str, float | None] = {v: None for v in _MEMINFO_KEYS.values()}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        name = _MEMINFO_KEYS.get(key.strip())
        if name is None:
            continue
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[name] = round(int(parts[0]) / 1024.0, 1)
    return out


def temp_c(raw: str | None) -> float | None:
    """A sysfs thermal reading in degrees C. Zones report millidegrees; a few old drivers report
    whole degrees, so readings with magnitude below 1000 are taken as degrees. Unreadable -> None."""
    if raw is None:
        return None
    s = raw.strip()
    if not re.fullmatch(r"-?\d+", s):
        return None
    v = int(s)
    return round(v / 1000.0, 1) if abs(v) >= 1000 else float(v)


def is_cpu_zone(zone_type: str) -> bool:
    return bool(_CPU_ZONE.match(zone_type.strip()))


def thermal_map(zones: list[tuple[str, str, str | None]]) -> dict[str, float]:
    """{zone type: temp C} from (zone dir name, type, raw temp). Zones without a readable temperature
    are left out; a zone without a type is keyed by its dir name; a repeated type is keyed
    "type/thermal_zoneN" so no reading is lost."""
    out: dict[str, float] = {}
    for name, ztype, raw in zones:
        t = temp_c(raw)
        if t is None:
            continue
        key = ztype.strip() or name
        if key in out:
            key = f"{key}/{name}"
        out[key] = t
    return out


def cpu_temp(thermal: dict[str, float]) -> float | None:
    """The hottest CPU-like zone (the gate's measure: not the battery or skin sensor), or None."""
    temps = [v for k, v in thermal.items() if is_cpu_zone(k) and -40.0 < v < 200.0]
    return max(temps) if temps else None


def _khz(raw: str | None) -> int | None:
    s = (raw or "").strip()
    return int(s) if s.isdigit() else None


def cpufreq_map(policies: list[tuple[str, str | None, str | None, str | None]]) -> dict[str, dict]:
    """{policy: {scaling_max_khz, cpuinfo_max_khz, scaling_cur_khz}} from (policy dir name,
    scaling_max_freq, cpuinfo_max_freq, scaling_cur_freq) raw texts; unreadable values are None."""
    return {
        name: {
            "scaling_max_khz": _khz(smax),
            "cpuinfo_max_khz": _khz(cmax),
            "scaling_cur_khz": _khz(cur),
        }
        for name, smax, cmax, cur in sorted(policies, key=lambda p: _natural(p[0]))
    }


def _natural(s: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s))


def parse_dumpsys_battery(text: str | None) -> dict | None:
    """`dumpsys battery` output -> {"level", "scale", "temp_c", "voltage_mv", "status", "health",
    "plugged", "present", "technology"}; None when the text has no battery level (no dumpsys)."""
    if not text:
        return None
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if sep:
            fields[key.strip().lower()] = val.strip()
    if not fields.get("level", "").lstrip("-").isdigit():
        return None

    def num(key: str) -> int | None:
        v = fields.get(key, "")
        return int(v) if v.lstrip("-").isdigit() else None

    temp = num("temperature")  # tenths of a degree C
    plugged = [src for src in ("ac", "usb", "wireless", "dock") if fields.get(f"{src} powered") == "true"]
    return {
        "level": num("level"),
        "scale": num("scale"),
        "temp_c": temp / 10.0 if temp is not None else None,
        "voltage_mv": num("voltage"),
        "status": num("status"),
        "health": num("health"),
        "plugged": plugged[0] if plugged else None,
        "present": fields["present"] == "true" if "present" in fields else None,
        "technology": fields.get("technology") or None,
    }


_THERMAL_STATUS = re.compile(r"^\s*Thermal Status:\s*(\d+)\s*$", re.MULTILINE)


def parse_thermal_status(text: str | None) -> int | None:
    """Android's thermal status (PowerManager THERMAL_STATUS_NONE 0 .. SHUTDOWN 6) from `dumpsys thermalservice`
    (ThermalManagerService's dump: "Thermal Status: N", the same line since Android 10); None without one."""
    m = _THERMAL_STATUS.search(text or "")
    if m is None:
        return None
    v = int(m.group(1))
    return v if v <= 6 else None


def build_sample(
    *,
    t: float,
    meminfo_text: str,
    zones: list[tuple[str, str, str | None]],
    policies: list[tuple[str, str | None, str | None, str | None]],
    battery_text: str | None,
    thermal_text: str | None = None,
) -> dict:
    """The sample (checked against DeviceSample) as a dict with every field."""
    thermal = thermal_map(zones)
    return DeviceSample(
        t=t,
        **parse_meminfo(meminfo_text),
        thermal=thermal,
        cpu_temp_c=cpu_temp(thermal),
        cpufreq=cpufreq_map(policies),
        battery=parse_dumpsys_battery(battery_text),
        thermal_status=parse_thermal_status(thermal_text),
    ).dump()


# ---- readers -------------------------------------------------------------------------------------------


def _read(p: Path) -> str | None:
    try:
        return p.read_text(errors="replace")
    except OSError:  # absent, or a zone whose driver refuses reads (EINVAL/ENODATA on some phones)
        return None


def read_local(root: Path = Path("/"), *, t: float | None = None, battery_text: str | None = None) -> dict:
    """One sample from the /proc and /sys under root (a fixture tree in tests)."""
    thermal_dir = root / "sys/class/thermal"
    zones = [
        (z.name, (_read(z / "type") or "").strip(), _read(z / "temp"))
        for z in sorted(thermal_dir.glob("thermal_zone*"), key=lambda p: _natural(p.name))
    ]
    cpufreq_dir = root / "sys/devices/system/cpu/cpufreq"
    policies = [
        (p.name, _read(p / "scaling_max_freq"), _read(p / "cpuinfo_max_freq"), _read(p / "scaling_cur_freq"))
        for p in cpufreq_dir.glob("policy*")
    ]
    return build_sample(
        t=time.time() if t is None else t,
        meminfo_text=_read(root / "proc/meminfo") or "",
        zones=zones,
        policies=policies,
        battery_text=battery_text,
    )


# One round trip on a device. Constant text (nothing from the user goes into it); $1 is a root prefix
# for tests ("" on a device). Output: sections introduced by lines starting with "@@", fields separated
# by tabs; `dumpsys` is optional (a Linux adbd has none).
STATE_SCRIPT = r"""R="${1:-}"
T=$(printf '\t')
echo "@@meminfo"
cat "$R/proc/meminfo" 2>/dev/null
for z in "$R"/sys/class/thermal/thermal_zone*; do
  [ -d "$z" ] || continue
  echo "@@zone$T${z##*/}$T$(cat "$z/type" 2>/dev/null)$T$(cat "$z/temp" 2>/dev/null)"
done
for p in "$R"/sys/devices/system/cpu/cpufreq/policy*; do
  [ -d "$p" ] || continue
  a=$(cat "$p/scaling_max_freq" 2>/dev/null); b=$(cat "$p/cpuinfo_max_freq" 2>/dev/null)
  c=$(cat "$p/scaling_cur_freq" 2>/dev/null)
  echo "@@policy$T${p##*/}$T$a$T$b$T$c"
done
echo "@@battery"
if command -v dumpsys >/dev/null 2>&1; then dumpsys battery 2>/dev/null; fi
echo "@@thermalservice"
if command -v dumpsys >/dev/null 2>&1; then
  dumpsys thermalservice 2>/dev/null | while IFS= read -r l; do case "$l" in "Thermal Status:"*) echo "$l";; esac; done
fi
echo "@@end"
"""


def parse_state_dump(text: str, *, t: float) -> dict:
    """The output of STATE_SCRIPT -> a sample (same shape as read_local)."""
    meminfo: list[str] = []
    battery: list[str] = []
    thermal: list[str] = []
    zones: list[tuple[str, str, str | None]] = []
    policies: list[tuple[str, str | None, str | None, str | None]] = []
    section = None
    for line in text.splitlines():
        if line.startswith("@@zone\t"):
            f = line.split("\t")
            f += [""] * (4 - len(f))
            zones.append((f[1], f[2], f[3] or None))
        elif line.startswith("@@policy\t"):
            f = line.split("\t")
            f += [""] * (5 - len(f))
            policies.append((f[1], f[2] or None, f[3] or None, f[4] or None))
        elif line.startswith("@@"):
            section = line[2:].strip()
        elif section == "meminfo":
            meminfo.append(line)
        elif section == "battery":
            battery.append(line)
        elif section == "thermalservice":
            thermal.append(line)
    return build_sample(
        t=t,
        meminfo_text="\n".join(meminfo),
        zones=zones,
        policies=policies,
        battery_text="\n".join(battery) or None,
        thermal_text="\n".join(thermal) or None,
    )
