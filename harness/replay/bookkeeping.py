"""What the expert cache's bookkeeping costs per token, and a digest of every decision it takes.

Drives `ExpertCache` exactly as the engine's hook does (harness/engine/stream/account.py): for each layer batch the
previous batch's evictions are decided first (`evict_over_budget`), then the batch is looked up with
`evict=False`. No llama.cpp, no I/O: only the cache's CPU time, per decode token.

Workloads (the Qwen3-30B-A3B shape: 48 layers, 128 experts):
- `qwen`: the real routing trace recorded on Qwen3-30B-A3B (top-6, 3059712-byte experts);
- `synth-top8`: uniform random top-8 routing with the synthetic model's 2654208-byte experts (what the
  engine campaigns on a generated model route like), a 16-token prompt then decode tokens.

This file also runs as a script (`python bookkeeping.py --worker ...`) against another checkout of the
package (PYTHONPATH), so an old and a new implementation are measured side by side in one run; it imports
only the expert cache (from the engine's facade, `harness.engine`; in a checkout from before it, from
`harness.engine.cache.expert_cache`, or `harness.engine.cache` before the engine's subpackages: the only deep imports
of the engine the structure test lets the harness make) and `harness.replay.trace`, which every version has.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
N_LAYER, N_EXPERT = 48, 128
SYNTH_EXPERT_BYTES = 2654208  # one expert of the generated qwen3-30b-a3b-shape model (gate + up + down)
REPO = Path(__file__).resolve().parents[2]
TRACES = REPO / "data" / "route-traces"


@dataclass(frozen=True)
class Workload:
    name: str
    batches: list[tuple[int, tuple[int, ...], int]]  # (layer, experts in routing order, decode token or -1)
    expert_bytes: list[int]
    decode_tokens: int
    n_expert: int = N_EXPERT


def synth_top8(decode: int = 64, prompt: int = 16, seed: int = 1) -> Workload:
    rng = random.Random(seed)
    out: list[tuple[int, tuple[int, ...], int]] = []
    for layer in range(N_LAYER):
        out.append((layer, tuple(e for _ in range(prompt) for e in rng.sample(range(N_EXPERT), 8)), -1))
    for tok in range(decode):
        for layer in range(N_LAYER):
            out.append((layer, tuple(rng.sample(range(N_EXPERT), 8)), tok))
    return Workload("synth-top8", out, [SYNTH_EXPERT_BYTES] * N_LAYER, decode)


def from_trace(path: Path) -> Workload:
    from harness.replay.trace import load_trace

    t = load_trace(path)
    return Workload(t.name, [(b.layer, b.experts, b.token) for b in t.batches], list(t.expert_bytes),
                    t.decode_tokens, t.n_expert)


def workload(name: str) -> Workload:
    """`synth-top8`, or a recorded trace of data/route-traces by name (`qwen`, `gptoss`)."""
    if name == "synth-top8":
        return synth_top8()
    return from_trace(TRACES / f"{name}.route.csv")


def drive(w: Workload, policy: str, budget_bytes: int) -> tuple[float, str]:
    """(ns of cache work per decode token, sha256 of every decision: each batch's hits, misses and the
    evictions decided after it, in order). The prompt's batches are driven but not timed."""
    try:
        from harness.engine import ExpertCache
    except ImportError:  # a checkout from before the engine's facade (harness.engine exports it since issue 37)
        try:
            from harness.engine.cache.expert_cache import ExpertCache  # type: ignore[no-redef]
        except ImportError:  # before the engine's subpackages: harness/engine/cache.py
            from harness.engine.cache import ExpertCache  # type: ignore[no-redef,attr-defined]

    cache = ExpertCache(budget_bytes, w.expert_bytes, policy, n_expert=w.n_expert)
    h = hashlib.sha256()
    due = False
    ns = 0
    clock = time.thread_time_ns  # CPU time of this thread: steady on a shared machine
    for layer, experts, token in w.batches:
        t0 = clock()
        ev = cache.evict_over_budget() if due else []
        res = cache.lookup_batch(layer, experts, evict=False)
        due = cache.enabled
        t1 = clock()
        if token >= 0:
            ns += t1 - t0
        h.update(repr((ev, res.hits, res.misses, res.evicted)).encode())
    if due:
        h.update(repr(cache.evict_over_budget()).encode())
    h.update(repr((cache.stats.hits, cache.stats.lookups, cache.stats.evictions)).encode())
    return ns / w.decode_tokens, h.hexdigest()


def _worker(args: list[str]) -> None:
    """--worker WORKLOAD BUDGET_MIB POLICY...: one JSON line per policy."""
    name, budget_mib, policies = args[0], int(args[1]), args[2:]
    import os

    import harness

    try:  # a checkout whose engine reads no environment: this worker's command line reads it for the engine
        from harness.engine import use_reference
    except ImportError:  # an older checkout: its engine reads BMOE_PURE_PYTHON_POLICIES itself
        pass
    else:
        use_reference(os.environ.get("BMOE_PURE_PYTHON_POLICIES", "") not in ("", "0"))

    w = workload(name)
    for p in policies:
        ns, digest = drive(w, p, budget_mib * MIB)
        print(json.dumps({"workload": name, "policy": p, "budget_mib": budget_mib, "ns_per_token": ns,
                          "digest": digest, "harness": harness.__file__}), flush=True)


def _run_worker(tree: Path, workload: str, budget_mib: int, policies: list[str], env_extra: dict | None = None
                ) -> list[dict]:
    """This file's worker in a fresh interpreter, with `tree`'s harness package on the path (and `env_extra`
    in its environment, e.g. BMOE_PURE_PYTHON_POLICIES=1)."""
    import os
    import subprocess

    me = Path(__file__).resolve()
    env = dict(os.environ, PYTHONPATH=str(tree), **(env_extra or {}))
    # -P: neither this file's folder nor the current one ahead of `tree` on the path
    out = subprocess.run([sys.executable, "-P", str(me), "--worker", workload, str(budget_mib), *policies], env=env,
                         cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"worker on {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def side_by_side(trees: dict[str, Path], workloads: list[str], policies: list[str], budget_mib: int,
                 rounds: int, envs: dict[str, dict] | None = None) -> list[dict]:
    """Every (tree, workload) measured `rounds` times, the trees alternating inside each round (the order
    flips every round so drift cancels). One row per measurement, with its tree's label as `impl`; `envs`
    adds environment variables to a label's workers."""
    rows = []
    labels = list(trees)
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for w in workloads:
            for label in order:
                for row in _run_worker(trees[label], w, budget_mib, policies, (envs or {}).get(label)):
                    rows.append({"impl": label, "round": r + 1, **row})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per (workload, policy): the median ns/token of each impl, their ratio (first impl / last) and
    whether every decision digest agreed across impls and rounds."""
    import statistics

    labels = list(dict.fromkeys(r["impl"] for r in rows))
    out = []
    for key in dict.fromkeys((r["workload"], r["policy"]) for r in rows):
        sel = [r for r in rows if (r["workload"], r["policy"]) == key]
        med = {lab: statistics.median(r["ns_per_token"] for r in sel if r["impl"] == lab) for lab in labels}
        out.append({"workload": key[0], "policy": key[1], "budget_mib": sel[0]["budget_mib"],
                    **{f"{lab}_ms_per_token": med[lab] / 1e6 for lab in labels},
                    "ratio": med[labels[0]] / med[labels[-1]] if med[labels[-1]] else float("inf"),
                    "same_decisions": len({r["digest"] for r in sel}) == 1})
    return out


def to_csv(rows: list[dict], cols: list[str]) -> str:
    def fmt(v: object) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    return ",".join(cols) + "\n" + "".join(",".join(fmt(r[c]) for c in cols) + "\n" for r in rows)


# The decision digests tests/fixtures/cache-decisions.json pins (written from the implementation before the
# bookkeeping was made cheap): every online policy on both recorded traces and the synthetic top-8 routing.
DIGEST_GRID = {"qwen": (1000, 2000, 4000), "gptoss": (1000, 2000), "synth-top8": (1100, 2000)}
ONLINE = ("lru", "lfu", "layer", "layer-lfu", "aged", "aged-decay", "aged-markov", "markov-duel")


def decision_digests(tree: Path) -> dict[str, str]:
    """`workload/policy/budget_mib` -> the decision digest, computed by `tree`'s implementation."""
    out = {}
    for w, budgets in DIGEST_GRID.items():
        for b in budgets:
            for row in _run_worker(tree, w, b, list(ONLINE)):
                out[f"{w}/{row['policy']}/{b}"] = row["digest"]
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--write-digests"]:  # --write-digests TREE OUT.json
    Path(sys.argv[3]).write_text(json.dumps(decision_digests(Path(sys.argv[2])), indent=1, sort_keys=True) + "\n")
if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    _worker(sys.argv[2:])
