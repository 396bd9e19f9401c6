"""Routing realism measures on traces whose answers are known: a model that repeats one token's experts, and uniform
routing, whose previous-token share sits at chance k/E."""

from __future__ import annotations

import numpy as np

from harness.formats.route_trace import parse_route_trace
from harness.replay import realism, realism_md


def _trace(routes: list[list[list[int]]], n_expert: int, k: int, name: str = "t"):
    """routes[token][layer] = experts; all decode."""
    n_layer = len(routes[0])
    lines = ["# route_trace v1",
             f"# model=m.gguf arch=qwen3moe n_layer={n_layer} n_expert={n_expert} n_expert_used={k}"]
    lines += [f"# layer={la} expert_bytes=1000 dense_bytes=10" for la in range(n_layer)]
    lines.append("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes")
    for t, tok in enumerate(routes):
        for la, es in enumerate(tok):
            lines += [f"0,1,{t},{la},{s},{e},-1,0,1000" for s, e in enumerate(es)]
    return parse_route_trace(lines, name)


def test_a_model_that_always_routes_alike():
    f = _trace([[[0, 1], [2, 3]]] * 50, n_expert=16, k=2)
    s = realism.all_stats(f)
    (dec,) = s["phases"]
    assert dec.prev_share_pct == 100.0 and dec.reuse_median == 1.0 and dec.reuse_within_1_pct == 100.0
    assert dec.skew_top10_pct == 100.0  # 2 experts (top ceil(16/10)=2) take every routing
    assert s["lru"][1] > 95.0  # one token cycle holds the whole working set after the first token


def test_uniform_routing_sits_at_chance():
    rng = np.random.default_rng(3)
    E, k = 32, 4
    routes = [[list(rng.choice(E, k, replace=False)) for _ in range(4)] for _ in range(600)]
    (dec,) = realism.all_stats(_trace(routes, E, k))["phases"]
    assert abs(dec.prev_share_pct - 100 * k / E) < 2.0
    assert abs(dec.skew_top10_pct - dec.skew_uniform_pct) < 3.0
    assert abs(dec.reuse_mean - dec.reuse_uniform_mean) < 1.0


def test_table_has_every_column():
    f = _trace([[[0, 1]], [[1, 2]], [[2, 3]]], n_expert=8, k=2)
    table = realism_md.rows([realism.all_stats(f)])
    assert set(table[0]) == set(realism_md.COLUMNS)
    assert realism_md.to_csv(table).splitlines()[0] == ",".join(realism_md.COLUMNS)
    assert "| t | decode | 3 |" in realism_md.markdown(table)
