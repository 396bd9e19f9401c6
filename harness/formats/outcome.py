"""A run's outcome: runs/<id>/outcome.json, written when the run is committed, and the body of the run's
record in the manifest (harness.formats.manifest.RunRecord adds the run's place in the plan and the
hashes of its raw files).

Every field is given for a finished run (status ok or failed); `None` means "not known" (no CSV, no
cgroup), not "absent"."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import model_validator

from harness.errors import UserError
from harness.formats.devstate import DeviceSample
from harness.formats.files import atomic_write_json
from harness.formats.folder_guard import read_json
from harness.formats.record import Record, validate


class GateRecord(Record):
    """What the cooldown gate did before the run."""

    waited_s: float
    gave_up: bool
    reason: str | None  # why it waited or gave up; None when the condition held at once
    unchecked: list[str]  # conditions that could not be checked on this target
    rested_s: float | None = None  # the fixed cool-down slept before the gate (cooldown.between_runs_s); absent: none


class Deferral(Record):
    """One time the gate gave up before a run under `cooldown.on_timeout: defer`: the run was not started
    (kept in the manifest's record of the run, runs[].deferrals, also once it has run)."""

    at: str  # ISO 8601 UTC, when the gate gave up
    waited_s: float
    reason: str  # the condition that was not met, as the gate says it
    cpu_temp_c: float | None = None  # the hottest CPU zone at the last check
    rested_s: float | None = None  # the fixed cool-down slept before that gate


class ThrottleRecord(Record):
    """Throttling seen in the device-state samples taken during a run (harness.devices.throttle): a cpufreq policy
    whose scaling_max_freq was below its cpuinfo_max_freq, or Android's thermal status above none."""

    capped: dict[str, float]  # policy -> its lowest scaling_max / cpuinfo_max during the run (capped policies only)
    min_cap: float | None  # the lowest of them; None: no policy was capped
    max_thermal_status: int | None  # the highest `dumpsys thermalservice` status seen; None: never read
    throttled_s: float  # seconds from each throttled sample to the next one
    samples: int  # samples read
    throttled_samples: int

    @property
    def throttled(self) -> bool:
        return self.throttled_samples > 0


class Eviction(Record):
    """The model file(s) dropped from the page cache before the run."""

    method: str
    files: list[str]
    errors: list[str]


LATER = ("model_sha256", "throttle")  # fields added after runs were first recorded: absent in older records


class Outcome(Record):
    """The fields but `status` default to None only so that a pending run's record (which has none of
    them) can share this field list; a finished run must give them all (checked)."""

    status: Literal["ok", "failed"]
    reason: str | None = None  # None when ok, else one line
    start: str | None = None  # ISO 8601 UTC, ms
    end: str | None = None
    wall_s: float | None = None
    exit_code: int | None = None  # None: never started, or killed
    tokens: int | None = None  # token rows in the CSV
    tok_s_all: float | None = None  # over all tokens, warm-up included (the report trims)
    peak_mem_mib: float | None = None  # peak of the memory-cap cgroup, if capped
    oom_killed: bool | None = None
    argv: list[str] | None = None  # the engine command line on the target
    model_evicted: Eviction | None = None
    gate: GateRecord | None = None
    entry_state: DeviceSample | None = None  # the sample that passed the gate
    n_state_samples: int | None = None
    sampler_errors: list[str] | None = None
    model_sha256: dict[str, str] | None = None  # the model files' sha256 as the run began (manifest v3)
    throttle: ThrottleRecord | None = None  # throttling during the run; None: no sample could tell (or older)

    @model_validator(mode="after")
    def _finished_runs_are_whole(self) -> Outcome:
        if self.status != "pending":
            missing = [f for f in Outcome.model_fields if f not in self.model_fields_set and f not in LATER]
            if missing:
                raise ValueError(f"the record of a finished run ({self.status}) lacks {', '.join(missing)}")
        return self

    def outcome(self) -> Outcome:
        """Just the outcome fields (of a RunRecord, say), as given."""
        return Outcome(**{k: getattr(self, k) for k in Outcome.model_fields if k in self.model_fields_set})


def write_outcome(path: Path | str, o: Outcome) -> None:
    atomic_write_json(path, o.dump())


def read_outcome(path: Path | str) -> Outcome:
    p = Path(path)
    try:
        obj = read_json(p, 2**20)  # a run's outcome is a few KB (harness.formats.folder_guard)
    except OSError as e:
        raise UserError(f"{p}: cannot read ({e.strerror})") from None
    return validate(Outcome, obj, str(p))  # type: ignore[return-value]
