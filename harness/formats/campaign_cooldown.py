"""A campaign's `cooldown:`: the gate before each run (temperature, free memory), the fixed cool-down between runs,
and what happens when the gate waits in vain (run hot, or defer: harness.campaigns.steady)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Cooldown(_Model):
    cpu_temp_max_c: float | None = Field(None, description="wait while the hottest CPU thermal zone is above this")
    mem_available_min_mib: int | None = Field(None, ge=0, description="wait while MemAvailable is below this")
    max_wait_s: float = Field(300.0, ge=0, description="longest wait before a run goes ahead (recorded, warned)")
    poll_s: float = Field(2.0, ge=0.1, description="seconds between checks")
    between_runs_s: float = Field(0.0, ge=0, le=86400, description=(
        "a fixed cool-down: seconds to wait before every run after the first on a device, before the gate "
        "(recorded per run)"))
    on_timeout: Literal["run", "defer"] = Field("run", description=(
        "when max_wait_s passes with the condition unmet: run (hot, recorded and warned) or defer (never run "
        "hot: the run goes to the end of the queue; left unrun after max_deferrals, and `run` again retries it)"))
    max_deferrals: int = Field(2, ge=0, le=100, description=(
        "with on_timeout: defer, times one run may go to the end of the queue in one session before it is "
        "left unrun"))


# Cooldown keys added after plans were first recorded: the plan record sets them only when not their default,
# so an older folder's plan hashes the same and resumes (harness.campaigns.runner.plan_record)
COOLDOWN_LATER = ("between_runs_s", "on_timeout", "max_deferrals")
