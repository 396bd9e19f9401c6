"""Correctness gates: streamed output == resident output, token for token, on generated models, for
every lossless knob; and a negative control showing the gate catches one wrong expert."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.formats.metrics_csv import read_metrics
from harness.formats.route_trace import DECODE, read_route_trace
from harness.synth import ModelSpec, make_model
from tests.helpers.engine import bmoe
from tests.helpers.gates import N
from tests.helpers.gates import stream as _stream

pytestmark = pytest.mark.engine

@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    specs = {
        "q4_k": ModelSpec(expert_type="q4_k", seed=1),
        "q8_0": ModelSpec(expert_type="q8_0", seed=2),
        "f32": ModelSpec(expert_type="f32", seed=3),
        "split3": ModelSpec(expert_type="q4_k", seed=4, n_split=3),
        "k4": ModelSpec(expert_type="q8_0", seed=5, n_expert=16, n_expert_used=4),
        "qwen2moe": ModelSpec(arch="qwen2moe", expert_type="q8_0", seed=6, head_dim=64, n_head_kv=4),
    }
    out = {}
    for name, spec in specs.items():
        paths = make_model(d / f"{name}.gguf", spec)
        out[name] = paths[0]
    return out


@pytest.mark.parametrize("name", ["q4_k", "q8_0", "f32"])
def test_cache_off_matches_resident(models, resident, tmp_path, name):
    r = _stream(models, tmp_path, name, "--cache-mb", "0")
    assert r.tokens == resident(name)
    assert r.summary["mib_read_per_token"] > 0
    assert r.summary["hit_pct"] == -1  # no cache: hit rate is unmeasured, not 0


def test_pure_python_callback_front_matches(models, resident, tmp_path):
    """The C front (cfilter.c) is built by the package build; the pure-Python front is its fallback."""
    c = _stream(models, tmp_path, "q4_k", "--cache-mb", "1")
    assert c.preamble["hook_front"] == "c-filter", "the C callback front was not built"
    py = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", env={"BMOE_HOOK": "python"})
    assert py.preamble["hook_front"] == "python"
    assert py.tokens == c.tokens == resident("q4_k")


@pytest.mark.parametrize("flags", [(), ("--no-odirect", "--io-threads", "3")])
def test_compiled_and_python_read_lanes_match(models, resident, tmp_path, flags):
    """The compiled read lanes (clanes.c) are built by the package build; the Python lanes are their fallback
    (BMOE_PURE_PYTHON_LANES=1): same tokens, both equal to resident, one wrong expert still diverges on both."""
    trace = tmp_path / "lanes.route.csv"
    c = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", *flags, "--route-trace", str(trace),
                env={"BMOE_PURE_PYTHON_LANES": "0"})
    assert c.preamble["io_lanes"] == "c", "the compiled read lanes were not built"
    py = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", *flags, env={"BMOE_PURE_PYTHON_LANES": "1"})
    assert py.preamble["io_lanes"] == "python"
    assert py.tokens == c.tokens == resident("q4_k")
    assert c.summary["mib_read_per_token"] == py.summary["mib_read_per_token"] > 0
    expert = next(r.expert for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == 1)
    wrong = {"BMOE_TEST_WRONG_EXPERT": f"1,{expert},{(expert + 1) % 8}"}
    for impl in ("0", "1"):
        bad = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", *flags,
                      env={**wrong, "BMOE_PURE_PYTHON_LANES": impl})
        assert bad.tokens != resident("q4_k"), f"BMOE_PURE_PYTHON_LANES={impl}: one wrong expert did not diverge"


def test_small_cache_with_evictions_matches(models, resident, tmp_path):
    # tiny Q4_K: 3 x 110592 B per expert, T = 4 layers x k=2 -> 0.84 MiB; 1 MiB holds 9 of the 32 experts
    r = _stream(models, tmp_path, "q4_k", "--cache-mb", "1")
    assert r.summary["evictions"] > 0, "the cache was meant to evict"
    assert r.tokens == resident("q4_k")
    rows = read_metrics(r.csv).rows  # the compute thread's CPU inside cache management: measured, within its wall
    cpu, wall, hidden = rows.mgmt_cpu_ms, rows.mgmt_ms, rows.mgmt_hidden_ms
    assert (cpu > 0).all() and (cpu <= wall + 0.1).all(), rows[["mgmt_ms", "mgmt_cpu_ms"]]
    assert ((hidden >= 0) & (hidden <= wall)).all(), rows[["mgmt_ms", "mgmt_hidden_ms"]]


def test_every_expert_cached_matches(models, resident, tmp_path):
    r = _stream(models, tmp_path, "q4_k", "--cache-mb", "1000")
    assert r.summary["evictions"] == 0
    assert r.summary["hit_pct"] > 50
    assert r.tokens == resident("q4_k")
    rows = read_metrics(r.csv).rows
    quiet = rows[rows.read_bytes == 0]  # a token that read nothing waited for no read: none of its mgmt was hidden
    assert len(quiet) > 0 and (quiet.mgmt_hidden_ms == 0).all(), rows[["read_bytes", "mgmt_hidden_ms"]]


def test_preloaded_cache_matches(models, resident, tmp_path):
    r = _stream(models, tmp_path, "q8_0", "--cache-mb", "1000", "--cache-preload")
    assert r.summary["hit_pct"] == 100.0 and r.summary["mib_read_per_token"] == 0
    assert r.tokens == resident("q8_0")


@pytest.mark.parametrize("flags", [("--no-odirect",), ("--io-threads", "1"), ("--io-threads", "4"),
                                   ("--io-threads", "8", "--no-odirect")])
def test_io_paths_match(models, resident, tmp_path, flags):
    r = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", *flags)
    assert r.tokens == resident("q4_k")
    assert r.preamble["odirect_effective"] == ("0" if "--no-odirect" in flags else "1")


def test_three_shards_match(models, resident, tmp_path):
    assert models["split3"].name.endswith("-00001-of-00003.gguf")
    r = _stream(models, tmp_path, "split3", "--cache-mb", "1")
    assert r.tokens == resident("split3")


def test_n_expert_used_override_matches_resident_override(models, resident, tmp_path):
    r = _stream(models, tmp_path, "k4", "--n-expert-used", "2", "--cache-mb", "0")
    assert r.tokens == resident("k4", "--n-expert-used", "2")
    assert "k=2 (read from the graph)" in r.stderr
    assert r.tokens != resident("k4"), "top-2 of a top-4 model should change the output (lossy knob)"


@pytest.mark.parametrize("fa", ["on", "auto"])
def test_flash_attention_streamed_matches_resident(models, resident, tmp_path, fa):
    r = _stream(models, tmp_path, "q8_0", "--flash-attn", fa, "--cache-mb", "3")
    assert r.tokens == resident("q8_0", "--flash-attn", fa)


def test_qwen2moe_shared_experts_resident(models, resident, tmp_path):
    r = _stream(models, tmp_path, "qwen2moe", "--cache-mb", "0")
    assert r.tokens == resident("qwen2moe")


def test_route_trace_written(models, tmp_path):
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, "q4_k", "--cache-mb", "1", "--route-trace", str(trace))
    assert trace.read_text().startswith("# route_trace v2\n")
    tr = read_route_trace(trace)
    assert (tr.header.n_layer, tr.header.k) == (4, 2)
    decode = [r for r in tr.rows if r.phase == DECODE]
    assert len(decode) == N * 4 * 2  # tokens x layers x k
    assert {r.residency for r in decode} <= {0, 1}


def test_negative_control_one_wrong_expert_diverges(models, resident, tmp_path):
    """Load expert e's slot of one layer with another expert's bytes: the gate must see it."""
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, "q4_k", "--cache-mb", "0", "--route-trace", str(trace))
    rows = read_route_trace(trace).rows
    layer, expert = 1, next(r.expert for r in rows if r.phase == DECODE and r.layer == 1)  # used in decode
    wrong = (expert + 1) % 8
    env = {"BMOE_TEST_WRONG_EXPERT": f"{layer},{expert},{wrong}"}
    r = _stream(models, tmp_path, "q4_k", "--cache-mb", "0", env=env)
    assert r.tokens != resident("q4_k")


def test_exception_in_callback_is_an_error_not_garbage(models, tmp_path):
    r = bmoe(models["q4_k"], "--moe-stream", "--cache-mb", "0", n=N, tmp=tmp_path,
             env={"BMOE_TEST_FAIL_AT_LAYER": "2"})
    assert r.rc == 3
    assert r.stdout.strip() == ""
    err = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(err) == 1 and "test fault injected at layer 2" in err[0]


def _online_policies() -> list[str]:
    from harness.engine.cache.policies import online_policies

    return online_policies()


@pytest.mark.parametrize("policy", _online_policies())
def test_every_cache_policy_matches_resident(models, resident, tmp_path, policy):
    """Each selectable policy evicts differently; none may change a single token."""
    r = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", "--cache-policy", policy)
    assert r.preamble["cfg.cache_policy"] == policy
    assert r.summary["evictions"] > 0
    assert r.tokens == resident("q4_k")


def test_offline_policy_is_refused(models, tmp_path):
    r = bmoe(models["q4_k"], "--moe-stream", "--cache-mb", "1", "--cache-policy", "belady", n=4, tmp=tmp_path)
    assert r.rc == 2 and "--cache-policy" in r.stderr


def test_route_replay_drives_routing_identically_in_both_modes(models, tmp_path):
    """--route-replay forces a recorded routing: the streamed run must still equal the resident run under
    the same replay, and the experts it routed must be the trace's."""
    src = tmp_path / "src.route.csv"
    _stream(models, tmp_path, "q8_0", "--cache-mb", "0", "--route-trace", str(src), env=None)
    # replay the q8_0 model's trace on the q4_k model (same shape): routing now differs from q4_k's own
    res = bmoe(models["q4_k"], "--route-replay", str(src), n=N, tmp=tmp_path)
    assert res.rc == 0, res.stderr
    assert "meaningless" in res.preamble["output_text"]
    out = tmp_path / "replayed.route.csv"
    st = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", "--route-replay", str(src), "--route-trace", str(out))
    assert st.tokens == res.tokens

    def decode_ids(p):
        return [(r.step, r.layer, r.expert) for r in read_route_trace(p).rows if r.phase == DECODE]

    assert decode_ids(out) == decode_ids(src)


# --recycle-pages (harness.engine.io.recycle): evicted slices' pages go to the next miss. The matrix: both kinds,
# evictions on O_DIRECT and buffered reads, one to eight lanes, decisions on the compute thread, three shards, Q8_0
# and F32 experts; each on the compiled and the Python lanes
RECYCLED = {
    "move-odirect": ("q4_k", "move", "--cache-mb", "1"),
    "memfd-odirect": ("q4_k", "memfd", "--cache-mb", "1"),
    "move-buffered-3-lanes": ("q4_k", "move", "--cache-mb", "1", "--no-odirect", "--io-threads", "3"),
    "memfd-buffered-3-lanes": ("q4_k", "memfd", "--cache-mb", "1", "--no-odirect", "--io-threads", "3"),
    "move-1-lane": ("q4_k", "move", "--cache-mb", "1", "--io-threads", "1"),
    "memfd-8-lanes-no-evict-thread": ("q4_k", "memfd", "--cache-mb", "2", "--io-threads", "8", "--no-evict-thread"),
    "move-3-shards": ("split3", "move", "--cache-mb", "1"),
    "memfd-q8_0-lfu": ("q8_0", "memfd", "--cache-mb", "2", "--cache-policy", "lfu"),
    "move-f32-buffered": ("f32", "move", "--cache-mb", "8", "--no-odirect"),
}


@pytest.mark.parametrize("lanes", ["c", "python"])
@pytest.mark.parametrize("case", list(RECYCLED))
def test_recycled_pages_match_resident(models, resident, tmp_path, case, lanes):
    name, kind, *flags = RECYCLED[case]
    r = _stream(models, tmp_path, name, *flags, "--recycle-pages", kind,
                env={"BMOE_PURE_PYTHON_LANES": "1" if lanes == "python" else "0"})
    assert r.preamble["io_lanes"] == lanes and r.preamble["cfg.recycle_pages"] == kind
    assert r.tokens == resident(name)
    s = r.summary
    assert s["evictions"] > 0 and s["pool_recycled"] > 0 and s["pool_errors"] == 0, s
    # memfd: every recycled slice's pages, at most the budget and one release batch (4 layers of k experts: on these
    # 4-layer models one token cycle T); move: the evicted pages held, at most the release batch
    assert 0 <= s["pool_mib"] <= (s["cache_budget_mib"] if kind == "memfd" else 0) + s["token_cycle_mib"] + 1e-3, s
    assert (s["rss_shmem_mib"] > 0) == (kind == "memfd") and 0 < s["vmas"] < s["max_map_count"]
    # what the flag changes, measured per generation (harness.engine.run.thread_clock): /proc ticks, 10 ms steps
    assert min(s["lanes_sys_ms"], s["lanes_user_ms"], s["main_cpu_ms"], s["releaser_cpu_ms"]) >= 0


def test_recycle_auto_is_move_with_a_cache_and_off_without(models, resident, tmp_path):
    """The default, auto: move with a cache (what the quiet run of bench-data/2026-12-04-recycle chose), off without one
    (the shared slots reuse their pages already), and off asked for is off; the CSV says which took effect."""
    auto = _stream(models, tmp_path, "q4_k", "--cache-mb", "1")
    assert auto.preamble["cfg.recycle_pages"] == "auto" and auto.preamble["recycle_pages_effective"] == "move (auto)"
    assert auto.tokens == resident("q4_k") and auto.summary["pool_recycled"] > 0 and auto.summary["pool_errors"] == 0
    slots = _stream(models, tmp_path, "q4_k", "--cache-mb", "0")
    assert slots.preamble["recycle_pages_effective"].startswith("off (auto: no expert cache")
    assert slots.tokens == resident("q4_k") and "pool_recycled" not in slots.summary
    off = _stream(models, tmp_path, "q4_k", "--cache-mb", "1", "--recycle-pages", "off")
    assert off.preamble["recycle_pages_effective"] == "off" and "pool_recycled" not in off.summary
    assert off.tokens == resident("q4_k") and off.summary["evictions"] > 0


@pytest.mark.parametrize("kind, lanes", [("move", "0"), ("memfd", "0"), ("move", "1"), ("off", "0")])
def test_one_wrong_expert_still_diverges_with_recycled_pages(models, resident, tmp_path, kind, lanes):
    """Buffered, so the wrong expert's bytes go through the lanes and land in recycled pages like every other read."""
    flags = ("--cache-mb", "1", "--recycle-pages", kind, "--no-odirect")
    env = {"BMOE_PURE_PYTHON_LANES": lanes}
    trace = tmp_path / "t.route.csv"
    _stream(models, tmp_path, "q4_k", *flags, "--route-trace", str(trace), env=env)
    expert = next(r.expert for r in read_route_trace(trace).rows if r.phase == DECODE and r.layer == 1)
    wrong = {"BMOE_TEST_WRONG_EXPERT": f"1,{expert},{(expert + 1) % 8}"}
    bad = _stream(models, tmp_path, "q4_k", *flags, env={**env, **wrong})
    assert (bad.summary.get("pool_recycled", 0) > 0) == (kind != "off")
    assert bad.tokens != resident("q4_k"), "one wrong expert did not diverge with recycled pages"


def test_recycled_pages_need_a_cache(models, tmp_path):
    r = bmoe(models["q4_k"], "--moe-stream", "--cache-mb", "0", "--recycle-pages", "move", n=2, tmp=tmp_path)
    assert r.rc == 2 and "--recycle-pages" in r.stderr and len(r.stderr.strip().splitlines()) == 1
