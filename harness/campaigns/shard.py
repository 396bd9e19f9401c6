"""Shards across labs: `bmoe-bench run FILE --shard K/N` runs its share of the plan, whole rounds: rounds
K, K+N, K+2N, ... (1-based). A round is every cell once, so each ratio stays paired within a round run on one
machine, and what differs between the labs' machines cancels in it as a round's drift does. The plan record
and its hash are the whole plan's (every shard's folder has the same one: `bmoe-bench merge` checks it);
the folder records which shard it holds (manifest `shard`), and resumes only as that shard.

Not sharded: a campaign with `precision:` (whether to add a round is decided from every run so far, which
no shard sees) and a fidelity campaign (its reference run is made once per folder)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from harness.campaigns.validate import Plan
from harness.errors import UserError

_FORM = re.compile(r"([0-9]+)/([0-9]+)")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @staticmethod
    def parse(text: str) -> Shard:
        """`K/N`, 1 <= K <= N, as a Shard; anything else a one-line UserError."""
        m = _FORM.fullmatch(text.strip())
        k, n = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
        if not m or n < 1 or not 1 <= k <= n:
            raise UserError(f"--shard {text}: give K/N, shard K of N with 1 <= K <= N (--shard 2/3)")
        return Shard(k, n)

    def takes(self, rnd: int) -> bool:
        """Whether round `rnd` (0-based) is this shard's."""
        return rnd % self.count == self.index - 1


def shard_plan(plan: Plan, shard: Shard | None) -> Plan:
    """The plan with only this shard's runs (their positions in the whole plan's order kept); the whole plan
    without a shard. Refused, in one line, where a shard cannot stand on its own."""
    if shard is None:
        return plan
    c = plan.campaign
    if c.precision is not None:
        raise UserError(f"--shard {shard}: campaign {c.name} has precision:, which adds rounds from every run so "
                        f"far, and a shard sees only its own; run it whole, or give it fixed repeats to shard it")
    if c.replicate is not None:
        raise UserError(f"--shard {shard}: campaign {c.name} replicates (replicate:), its tries one after the "
                        f"other with waits between them on one machine; run it whole")
    if c.fidelity is not None:
        raise UserError(f"--shard {shard}: campaign {c.name} is a fidelity campaign, whose reference run is made "
                        f"once per folder; run it whole")
    rounds = 1 + max(r.round for r in plan.runs)
    if shard.count > rounds:
        raise UserError(f"--shard {shard}: the plan has {rounds} round(s) (repeats: {rounds}) and a shard runs "
                        f"whole rounds, so that every ratio is paired on one machine: shard it in at most "
                        f"{rounds}, or raise repeats")
    return replace(plan, runs=[r for r in plan.runs if shard.takes(r.round)])


def rounds_text(plan: Plan) -> str:
    """`rounds 1, 3` of a sharded plan, for the console."""
    rounds = sorted({r.round + 1 for r in plan.runs})
    return f"round{'s' if len(rounds) > 1 else ''} " + ", ".join(map(str, rounds))
