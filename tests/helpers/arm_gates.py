"""The byte-identity gates scripts/arm-gates.sh runs on llama.cpp's ARM code paths (an arm64 root file system under
user-mode emulation, issue 27): for every architecture of the registry's COVERED list, node ids of the gate module
that covers it: streamed == resident with the cache off, with a cache small enough to evict on two reader lanes,
and its wrong-expert negative control where the module has one; beside them prefetch's gates (no architecture of
their own: qwen3moe's generated model). One pytest invocation runs them all:

    python -m tests.helpers.arm_gates            # the node ids, one a line (--smoke: the short subset)
    python -m tests.helpers.arm_gates --summarize junit.xml   # that run's table, one row per architecture

tests/gates/test_arm_gates_plan.py checks that every covered architecture is here and that every node id exists."""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.arch_specs import ARCH_SPECS

_ENGINE = "tests/gates/test_engine_gates.py"
_ARCHS = "tests/gates/test_arch_gates.py"
_ARCHS_B = "tests/gates/test_archs_b.py"
_GPTOSS = "tests/gates/test_gptoss.py"
_PREFETCH = "tests/gates/test_prefetch_gates.py"


def _own_module(module: str, negative: str) -> tuple[str, ...]:
    """A one-architecture module on tests/helpers/arch_gates.py's GATE_FLAGS: flags0 is the cache off, flags2 an
    evicting cache on 2 reader lanes; then its negative control."""
    return (f"{module}::test_streamed_matches_resident[flags0]", f"{module}::test_streamed_matches_resident[flags2]",
            f"{module}::{negative}")


def _arch_gates(name: str) -> tuple[str, ...]:
    return tuple(f"{_ARCHS}::{t}[{name}]" for t in ("test_cache_off_matches_resident",
                                                     "test_evicting_cache_on_two_lanes_matches_resident",
                                                     "test_one_wrong_expert_diverges"))


def _archs_b(arch: str) -> tuple[str, ...]:
    return tuple(f"{_ARCHS_B}::test_streamed_matches_resident[{arch}-{flags}]"
                 for flags in ("cache-off", "evictions-2-lanes"))


def _by_arch() -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {
        "qwen3moe": (f"{_ENGINE}::test_cache_off_matches_resident[q4_k]",
                     f"{_ENGINE}::test_small_cache_with_evictions_matches",
                     # the compiled and the Python read lanes, and one wrong expert diverging on both
                     f"{_ENGINE}::test_compiled_and_python_read_lanes_match[flags0]",
                     f"{_ENGINE}::test_negative_control_one_wrong_expert_diverges"),
        "qwen2moe": (f"{_ENGINE}::test_qwen2moe_shared_experts_resident",),
        # gpt-oss's flags2 is its evicting cache on 2 lanes (its own list, not GATE_FLAGS)
        "gpt-oss": (f"{_GPTOSS}::test_streamed_matches_resident[flags0]",
                    f"{_GPTOSS}::test_streamed_matches_resident[flags2]",
                    f"{_GPTOSS}::test_negative_control_one_wrong_expert_diverges"),
        "gemma4": _own_module("tests/gates/test_gemma4.py",
                              "test_negative_controls_one_wrong_expert_and_a_zeroed_down_scale_diverge"),
        "deepseek4": _own_module("tests/gates/test_deepseek4.py",
                                 "test_negative_control_one_wrong_expert_in_a_hash_layer_diverges"),
        "bailingmoe3": _own_module("tests/gates/test_bailingmoe3.py",
                                   "test_negative_control_one_wrong_expert_diverges"),
    }
    for name, spec in ARCH_SPECS.items():  # qwen3moe-k-per-layer is qwen3moe's: added to its row
        out[spec.arch] = out.get(spec.arch, ()) + _arch_gates(name)
    for arch in ("qwen35moe", "qwen3next", "lfm2moe", "minimax-m2", "llama4"):
        out[arch] = _archs_b(arch)
    out["qwen35moe"] += (f"{_ARCHS_B}::test_negative_control_one_wrong_expert_diverges",)
    return out


BY_ARCH: dict[str, tuple[str, ...]] = _by_arch()
# gates of a knob rather than an architecture
KNOBS: dict[str, tuple[str, ...]] = {
    "prefetch": (f"{_PREFETCH}::test_prefetch_streamed_matches_resident[flags0]",  # --prefetch 1
                 f"{_PREFETCH}::test_prefetch_streamed_matches_resident[flags5]",  # --predict-prefetch
                 f"{_PREFETCH}::test_one_wrong_expert_still_diverges_with_prefetch_on[mode0]"),
}
# the short subset (CI, a quick look): one architecture's cache-off and evicting gates and its negative control
SMOKE: dict[str, tuple[str, ...]] = {"olmoe": _arch_gates("olmoe")}


def groups(smoke: bool = False) -> dict[str, tuple[str, ...]]:
    return dict(SMOKE) if smoke else {**BY_ARCH, **KNOBS}


def nodes(smoke: bool = False) -> list[str]:
    """Each module's node ids together (in the order modules first appear): pytest sets a module's fixtures (its
    generated models, their resident runs) up again each time its tests resume after another module's."""
    seen: dict[str, None] = {}
    for ids in groups(smoke).values():
        seen.update(dict.fromkeys(ids))
    modules = list(dict.fromkeys(n.split("::")[0] for n in seen))
    return sorted(seen, key=lambda n: modules.index(n.split("::")[0]))


# ---- the run's results (JUnit XML, as pytest --junitxml writes it) --------------------------------------------


@dataclass(frozen=True)
class Case:
    node: str  # path::name, as in BY_ARCH
    outcome: str  # passed, failed, error, skipped
    seconds: float


@dataclass(frozen=True)
class Row:
    group: str
    cases: tuple[Case, ...]

    def count(self, outcome: str) -> int:
        return sum(c.outcome == outcome for c in self.cases)


def read_junit(text: str) -> list[Case]:
    """The test cases of a JUnit XML report; a case's node id is its classname as a path, then its name."""
    out = []
    for tc in ET.fromstring(text).iter("testcase"):
        path = tc.get("classname", "").replace(".", "/") + ".py"
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if tc.find(child) is not None:
                outcome = name
                break
        out.append(Case(f"{path}::{tc.get('name', '')}", outcome, float(tc.get("time", "0") or 0)))
    return out


def summarize(cases: list[Case], plan: dict[str, tuple[str, ...]]) -> list[Row]:
    """One row per group of the plan, with the cases of its node ids (a node that did not run has no case)."""
    by_node = {c.node: c for c in cases}
    return [Row(group, tuple(by_node[n] for n in ids if n in by_node)) for group, ids in plan.items()]


def table(rows: list[Row], plan: dict[str, tuple[str, ...]]) -> str:
    lines = ["| architecture | gates | passed | failed | skipped | not run | seconds |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        bad = r.count("failed") + r.count("error")
        lines.append(f"| `{r.group}` | {len(plan[r.group])} | {r.count('passed')} | {bad} | {r.count('skipped')} | "
                     f"{len(plan[r.group]) - len(r.cases)} | {sum(c.seconds for c in r.cases):.0f} |")
    failed = [c.node for r in rows for c in r.cases if c.outcome in ("failed", "error")]
    if failed:
        lines += ["", "Failed:", *(f"- `{n}`" for n in failed)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.helpers.arm_gates", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="the short subset")
    p.add_argument("--summarize", metavar="JUNIT_XML", help="print the run's table from its JUnit XML")
    a = p.parse_args(argv)
    if a.summarize is None:
        print("\n".join(nodes(a.smoke)))
        return 0
    path = Path(a.summarize)
    if not path.is_file():
        print(f"arm_gates: {path}: no such file; pass the --junitxml file of the gates' pytest run", file=sys.stderr)
        return 2
    plan = groups(a.smoke)
    print(table(summarize(read_junit(path.read_text(encoding="utf-8")), plan), plan))
    return 0


if __name__ == "__main__":
    sys.exit(main())
