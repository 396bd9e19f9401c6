"""Shared by the fidelity tests: every architecture's tiny model (the specs the byte-identity gates use), a text
long enough for two scoring chunks, and `bmoe --fidelity-ref` / `--fidelity-against` as real subprocesses."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from harness.formats.fidelity import FidelityCsv, read_fidelity_csv
from harness.synth import ModelSpec
from harness.synth.shapes import shape_spec
from tests.helpers.arch_specs import ARCH_SPECS
from tests.helpers.engine import BMOE

# name -> (spec, a cache budget in MiB that evicts on it: the byte-identity gates' own)
TINY_MODELS: dict[str, tuple[ModelSpec, int]] = {
    **{name: (spec, 1) for name, spec in ARCH_SPECS.items()},
    **{a: (shape_spec("tiny", arch=a, seed=30 + i), 1)
       for i, a in enumerate(("qwen35moe", "qwen3next", "lfm2moe", "minimax-m2", "llama4"))},
    "gemma4": (dataclasses.replace(shape_spec("tiny", arch="gemma4", expert_type="q8_0"), seed=31), 3),
    "gpt-oss": (dataclasses.replace(shape_spec("tiny", arch="gpt-oss"), n_swa=16, seed=21), 1),
    "deepseek4": (dataclasses.replace(shape_spec("tiny", arch="deepseek4", expert_type="q8_0"), seed=41), 3),
    "bailingmoe3": (dataclasses.replace(shape_spec("tiny", arch="bailingmoe3", expert_type="q8_0"), seed=51), 2),
}

WORDS = ("the expert cache keeps hot experts near while cold ones stream from flash and the router picks a few of "
         "many for every token in every layer").split()


def text(n_words: int, seed: int = 1) -> str:
    """Deterministic filler text (a byte-level tiny vocabulary makes about one token per character)."""
    import random

    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


@dataclass
class FidRun:
    rc: int
    stderr: str
    line: dict[str, str]  # the `fidelity:` line's key=value pairs (against runs)
    csv: FidelityCsv | None


def fidelity(model: Path | str, *flags: str, tmp: Path, env: dict[str, str] | None = None) -> FidRun:
    """One `bmoe` run with the given flags (--fidelity-ref OUT -p TEXT, or --fidelity-against REF: then the per-
    position CSV is written and read back)."""
    csv = None
    if "--fidelity-against" in flags:
        csv = tmp / f"fid-{len(list(tmp.glob('fid-*.csv')))}.csv"
        flags = (*flags, "--fidelity-csv", str(csv))
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([*BMOE, "-m", str(model), "-t", "2", *flags], capture_output=True, text=True,
                       errors="replace", env=e, timeout=600)
    m = re.search(r"^fidelity: (.*)$", p.stderr, flags=re.M)
    line = dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv) if m else {}
    return FidRun(p.returncode, p.stderr, line, read_fidelity_csv(csv) if p.returncode == 0 and csv else None)
