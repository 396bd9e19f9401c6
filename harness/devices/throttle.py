"""Throttling during a run, from the device-state samples taken while it ran (pure: samples in, a record out).

A sample is throttled when a cpufreq policy's ceiling (scaling_max_freq) is below its hardware maximum
(cpuinfo_max_freq), as a thermal governor caps it, or when Android's thermal status (`dumpsys thermalservice`) is
LIGHT (1) or above. `throttle_record` says which policies were capped and how far (the lowest ceiling as a share
of the maximum), the highest thermal status, and how long the run was throttled: each throttled sample counts
until the next sample (the last one until `end_t`, when given). None when no sample could tell (no cpufreq and
no thermal status: a VM, a Linux box without cpufreq)."""

from __future__ import annotations

from collections.abc import Iterable

from harness.formats.devstate import DeviceSample
from harness.formats.outcome import ThrottleRecord

THERMAL_STATUS_MIN = 1  # PowerManager.THERMAL_STATUS_LIGHT: the first status at which the platform throttles


def _caps(s: DeviceSample) -> dict[str, float]:
    """policy -> scaling_max / cpuinfo_max for each policy capped below its maximum in this sample."""
    out = {}
    for name, f in s.cpufreq.items():
        if f.scaling_max_khz is not None and f.cpuinfo_max_khz and f.scaling_max_khz < f.cpuinfo_max_khz:
            out[name] = f.scaling_max_khz / f.cpuinfo_max_khz
    return out


def _tells(s: DeviceSample) -> bool:
    """The sample can say whether the device was throttled."""
    return s.thermal_status is not None or any(
        f.scaling_max_khz is not None and f.cpuinfo_max_khz for f in s.cpufreq.values())


def throttle_record(samples: Iterable[DeviceSample | dict], end_t: float | None = None) -> ThrottleRecord | None:
    ss = [x if isinstance(x, DeviceSample) else DeviceSample.model_validate(x) for x in samples]
    ss = [x for x in ss if _tells(x)]
    if not ss:
        return None
    timed = sorted((x for x in ss if x.t is not None), key=lambda x: x.t)  # type: ignore[arg-type, return-value]
    capped: dict[str, float] = {}
    statuses = [x.thermal_status for x in ss if x.thermal_status is not None]
    n_throttled = 0
    seconds = 0.0
    for x in ss:
        caps = _caps(x)
        for k, v in caps.items():
            capped[k] = min(capped.get(k, 1.0), v)
        if caps or (x.thermal_status or 0) >= THERMAL_STATUS_MIN:
            n_throttled += 1
    for i, x in enumerate(timed):
        if not (_caps(x) or (x.thermal_status or 0) >= THERMAL_STATUS_MIN):
            continue
        nxt = timed[i + 1].t if i + 1 < len(timed) else end_t
        if nxt is not None and x.t is not None and nxt > x.t:
            seconds += nxt - x.t
    return ThrottleRecord(capped={k: round(v, 4) for k, v in sorted(capped.items())},
                          min_cap=round(min(capped.values()), 4) if capped else None,
                          max_thermal_status=max(statuses) if statuses else None,
                          throttled_s=round(seconds, 2), samples=len(ss), throttled_samples=n_throttled)
