"""Device-state samples: memory, thermal zones, cpufreq policies, battery and Android's thermal status at one
moment, as the cooldown gate records at a run's entry (the manifest's `entry_state`) and the sampler writes about
once a second during it (runs/<id>/state.jsonl, one JSON object per line, keys sorted).

A source that was missing (an empty sysfs in a VM, no dumpsys on a Linux adbd) is None or empty, never 0.
The lines carry no version of their own: they belong to the manifest of their folder."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from harness.errors import UserError
from harness.formats.files import disk_full, is_disk_full
from harness.formats.folder import STATE_FILE as STATE_FILE  # campaigns/runner.py imports it from here
from harness.formats.folder_guard import MAX_RAW, loads, read_lines
from harness.formats.record import Record, problem


class CpuFreq(Record):
    """One cpufreq policy, in kHz; None where unreadable."""

    scaling_max_khz: int | None = None
    cpuinfo_max_khz: int | None = None
    scaling_cur_khz: int | None = None


class Battery(Record):
    """`dumpsys battery` (Android)."""

    level: int | None = None
    scale: int | None = None
    temp_c: float | None = None
    voltage_mv: int | None = None
    status: int | None = None
    health: int | None = None
    plugged: str | None = None  # ac, usb, wireless, dock
    present: bool | None = None
    technology: str | None = None


class DeviceSample(Record):
    """One sample. Every field is optional: an unreadable device gives an empty sample ({})."""

    t: float | None = None  # epoch seconds
    mem_total_mib: float | None = None
    mem_available_mib: float | None = None
    mem_free_mib: float | None = None
    cached_mib: float | None = None
    swap_free_mib: float | None = None
    thermal: dict[str, float] = {}  # zone type -> degrees C
    cpu_temp_c: float | None = None  # the hottest CPU-like zone
    cpufreq: dict[str, CpuFreq] = {}  # policy name -> frequencies
    battery: Battery | None = None
    thermal_status: int | None = None  # Android's `dumpsys thermalservice` "Thermal Status" (0 none .. 6 shutdown)


def state_lines(samples: Iterable[dict]) -> str:
    """The state.jsonl text of samples given as dicts (each checked against DeviceSample)."""
    return "".join(json.dumps(DeviceSample.model_validate(s).dump(), sort_keys=True) + "\n" for s in samples)


def write_states(path: Path | str, samples: Iterable[dict]) -> None:
    text = state_lines(samples)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, len(text.encode())) from None
        raise


def read_states(path: Path | str) -> list[DeviceSample]:
    """The samples of a state.jsonl; [] when the file is absent. A line that is not JSON (a torn write) is
    skipped; one that is JSON but not a sample, or nested too deep, is an error naming the file and line; a file
    larger than MAX_RAW, or not a plain file, is refused (harness.formats.folder_guard)."""
    p = Path(path)
    out = []
    try:
        for n, line in read_lines(p, MAX_RAW):  # streamed: one line in memory at a time
            if not line.strip():
                continue
            try:
                obj = loads(line, f"{p}:{n}")
            except json.JSONDecodeError:
                continue
            try:
                out.append(DeviceSample.model_validate(obj))
            except ValidationError as e:
                raise UserError(f"{p}:{n}: not a device-state sample ({problem(e)})") from None
    except FileNotFoundError:
        return []
    return out
