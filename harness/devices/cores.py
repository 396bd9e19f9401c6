"""A device's CPU cores by speed, from cpufreq's policies (pure: the text the device printed in, choices out).

    parse_policies(text)      POLICY_SCRIPT's output -> [CpuPolicy], each value checked (the device is untrusted)
    fastest_cores(pols, n)    the n fastest cores: policies by cpuinfo_max_freq, fastest first
    cpu_mask(cpus)            the hexadecimal mask taskset takes"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CPU = 4095

# one line per cpufreq policy: name|related_cpus|cpuinfo_max_freq|scaling_governor|scaling_available_governors
POLICY_SCRIPT = r"""for d in /sys/devices/system/cpu/cpufreq/policy*; do
  [ -d "$d" ] || continue
  r() { cat "$d/$1" 2>/dev/null; }
  echo "${d##*/}|$(r related_cpus)|$(r cpuinfo_max_freq)|$(r scaling_governor)|$(r scaling_available_governors)"
done"""

_NAME = re.compile(r"policy[0-9]{1,4}")
_GOV = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True)
class CpuPolicy:
    name: str  # policyN
    cpus: tuple[int, ...]  # related_cpus
    max_khz: int  # cpuinfo_max_freq
    governor: str | None  # scaling_governor in force (None when unreadable)
    governors: tuple[str, ...] = ()  # scaling_available_governors


def parse_cpus(text: str) -> tuple[int, ...] | None:
    """related_cpus ("4 5 6", or a list like "4-6,8") -> sorted cpus; None when it is not one."""
    out: set[int] = set()
    for part in re.split(r"[\s,]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"([0-9]{1,4})(?:-([0-9]{1,4}))?", part)
        if m is None:
            return None
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo or hi > MAX_CPU:
            return None
        out.update(range(lo, hi + 1))
    return tuple(sorted(out)) or None


def parse_policies(text: str) -> list[CpuPolicy]:
    """POLICY_SCRIPT's lines -> the policies whose name, cpus and maximum frequency read well (others left out)."""
    out: list[CpuPolicy] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not _NAME.fullmatch(parts[0]) or not parts[2].strip().isdigit():
            continue
        cpus = parse_cpus(parts[1])
        if cpus is None:
            continue
        gov = parts[3].strip()
        out.append(CpuPolicy(parts[0], cpus, int(parts[2].strip()[:12]), gov if _GOV.fullmatch(gov) else None,
                             tuple(g for g in parts[4].split() if _GOV.fullmatch(g))))
    return out


def fastest_cores(policies: list[CpuPolicy], n: int) -> tuple[int, ...]:
    """The n fastest cores: whole policies by cpuinfo_max_freq, fastest first (ties: the higher cpus first, as the
    big cluster is last on phones), and within the last one needed, its lowest cpus. Fewer when the device has
    fewer cores; a core two policies claim counts once."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    chosen: list[int] = []
    for p in sorted(policies, key=lambda p: (p.max_khz, max(p.cpus)), reverse=True):
        for c in p.cpus:
            if len(chosen) == n:
                break
            if c not in chosen:
                chosen.append(c)
    return tuple(sorted(chosen))


def policies_of(policies: list[CpuPolicy], cpus: tuple[int, ...]) -> list[CpuPolicy]:
    """The policies that drive any of these cpus, in the device's order."""
    return [p for p in policies if set(p.cpus) & set(cpus)]


def cpu_mask(cpus: tuple[int, ...] | list[int]) -> str:
    """cpus -> taskset's hexadecimal mask without 0x: (7,) -> "80", (4, 5, 6, 7) -> "f0"."""
    if not cpus or any(not 0 <= c <= MAX_CPU for c in cpus):
        raise ValueError(f"cpus {cpus} are not 0..{MAX_CPU}")
    return format(sum(1 << c for c in set(cpus)), "x")
