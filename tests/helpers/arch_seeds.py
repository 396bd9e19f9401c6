"""Try seeds for one of ARCH_SPECS' tiny models (tests/helpers/arch_specs.py): for each, generate the model with that
seed and run the gates' resident reference as tests/gates/test_arch_gates.py's `resident` fixture runs it (plain
`bmoe`, no hook, N greedy tokens, 2 threads), then print its tokens and whether the gates could use it. Run it on
every machine the gates must pass on (x86-64; arm64 in scripts/arm-gates.sh's root file system: `scripts/arm-rerun.sh
seeds NAME SEED...`) and keep a seed all of them accept:

    python -m tests.helpers.arch_seeds granitemoe 32 40-47

One line a seed (`seed S: ok|degenerate|stopped early|failed (...), D distinct of N: [tokens]`), then the accepted
seeds, most distinct tokens first."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path

from harness.synth import make_model
from tests.helpers.arch_specs import ARCH_SPECS, N, degenerate
from tests.helpers.engine import bmoe


def parse_seeds(words: list[str]) -> list[int]:
    """'7' and '40-47' (both ends included) to seeds, in the order given; ValueError on anything else."""
    out: list[int] = []
    for w in words:
        lo, sep, hi = w.partition("-")
        a, b = int(lo), int(hi) if sep else int(lo)
        if a < 0 or b < a:
            raise ValueError(w)
        out += range(a, b + 1)
    return out


def verdict(rc: int, tokens: list[int]) -> str:
    if rc != 0:
        return f"failed (exit {rc})"
    if len(tokens) != N:
        return "stopped early"
    return "degenerate" if degenerate(tokens) else "ok"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.helpers.arch_seeds", description=__doc__.split("\n\n")[0])
    ap.add_argument("name", choices=list(ARCH_SPECS), help="the ARCH_SPECS entry whose seed is tried")
    ap.add_argument("seeds", nargs="+", help="seeds, or ranges such as 40-47")
    a = ap.parse_args(argv)
    try:
        seeds = parse_seeds(a.seeds)
    except ValueError as e:
        ap.error(f"not a seed or a range LO-HI: {e}")
    accepted: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory(prefix="arch-seeds-") as d:
        for seed in seeds:
            model = make_model(Path(d) / f"{a.name}-{seed}.gguf", dataclasses.replace(ARCH_SPECS[a.name], seed=seed))[0]
            r = bmoe(model, n=N, tmp=Path(d) / f"runs-{seed}")
            v = verdict(r.rc, r.tokens)
            err = f" {r.stderr.strip().splitlines()[-1]}" if r.rc != 0 and r.stderr.strip() else ""
            print(f"seed {seed}: {v}{err}, {len(set(r.tokens))} distinct of {N}: {r.tokens}", flush=True)
            if v == "ok":
                accepted.append((len(set(r.tokens)), seed))
            model.unlink()
    print("accepted:", " ".join(str(s) for _, s in sorted(accepted, key=lambda x: (-x[0], x[1]))) or "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
