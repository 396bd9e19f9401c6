"""Replication as MLPerf Mobile asks it (campaign key `replicate:`), declared once here.

    replicate: {tries: 5, within_pct: 5, wait_s: 300}

The campaign's headline comparison (every cell's tok/s ratio to the base cell on the same device: the "x base"
column, paired over rounds) is measured `tries` times, each try a separate whole pass over every cell
(`repeats` rounds), with `wait_s` seconds between the end of one try and the start of the next. The runs of try
k are rounds k*repeats .. (k+1)*repeats - 1 of the plan, recorded with `try_index` k in the manifest. It
replicated when, for every comparison, the largest try's ratio is at most `within_pct` percent above the
smallest (harness.report.replicate_stats)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_TRIES = 50
MAX_WAIT_S = 3600.0


class Replicate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tries: int = Field(5, ge=2, le=MAX_TRIES, description=(
        "separate passes over every cell (each `repeats` rounds); the headline ratios are compared across them"))
    within_pct: float = Field(5.0, gt=0, le=10_000, description=(
        "it replicated when every ratio's largest try is at most this many percent above its smallest"))
    wait_s: float = Field(300.0, ge=0, le=MAX_WAIT_S, description=(
        "seconds between the end of one try and the start of the next (MLPerf Mobile: 300)"))


def planned_rounds(c) -> int:
    """The rounds a CampaignFile plans up front: its repeats, once per try when it replicates."""
    return c.min_repeats() * (c.replicate.tries if c.replicate is not None else 1)


def try_of(rnd: int, repeats: int, rep: Replicate | None) -> int | None:
    """The 0-based try of 0-based round `rnd` (None when the campaign does not replicate)."""
    return None if rep is None else rnd // repeats


def tries_text(rep: Replicate) -> str:
    """`5 tries, 300 s apart`, for the console."""
    return f"{rep.tries} tries, {rep.wait_s:g} s apart"


def replicate_problems(c) -> list[tuple[tuple, str]]:
    """The rules between `replicate:` and the rest of a CampaignFile, as (location, message)."""
    if c.replicate is None:
        return []
    out: list[tuple[tuple, str]] = []
    if c.precision is not None:
        out.append((("replicate",), "replicate repeats fixed rounds per try; precision adds rounds as it goes: "
                                    "give one of them"))
    if c.quality is not None:
        out.append((("replicate",), "replicate compares tok/s ratios across tries; a quality campaign's figure "
                                    "is its grades: remove replicate"))
    return out
