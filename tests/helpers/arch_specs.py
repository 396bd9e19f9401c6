"""The tiny synthetic model of each architecture gated in tests/gates/test_arch_gates.py (its spec, with a seed whose
resident output is not degenerate on x86-64 and on arm64: llama.cpp's NEON kernels sum in another order than its x86
ones, so a seed's greedy text can differ, and fall into a repeat, on one of them; `python -m tests.helpers.arch_seeds`
tries seeds); tests/engine/test_arch_layouts.py reads the same specs."""

from __future__ import annotations

from harness.synth import ModelSpec

N = 12  # tokens per gate run: enough to route every layer differently, few enough to keep ~40 runs cheap

ARCH_SPECS: dict[str, ModelSpec] = {
    "olmoe": ModelSpec(arch="olmoe", n_head_kv=4, seed=31),
    # 41: the same 12 distinct tokens on x86-64 and arm64; 32 was degenerate on arm64 ([205, 220, 146, 160, 49, 8, 8,
    # 8, ...]: bench-data/2026-12-03-arm-gates; seeds tried: bench-data/2026-12-03-arm-gates-targeted)
    "granitemoe": ModelSpec(arch="granitemoe", seed=41),
    "llama": ModelSpec(arch="llama", seed=33),
    "deepseek2": ModelSpec(arch="deepseek2", n_head_kv=4, seed=34),
    "glm4moe": ModelSpec(arch="glm4moe", seed=35, n_layer=6),  # 1 dense, 4 MoE, 1 nextn: enough experts to evict
    "ernie4_5-moe": ModelSpec(arch="ernie4_5-moe", seed=36),
    "hunyuan-moe": ModelSpec(arch="hunyuan-moe", seed=37),
    "dots1": ModelSpec(arch="dots1", n_head_kv=4, seed=38),
    "bailingmoe2": ModelSpec(arch="bailingmoe2", seed=39),
    # a per-layer expert_used_count array (any architecture may carry one)
    "qwen3moe-k-per-layer": ModelSpec(arch="qwen3moe", seed=40, expert_used_per_layer=(2, 2, 2, 2)),
}


def degenerate(tokens: list[int]) -> bool:
    """A reference stream the gates cannot use: half its tokens or fewer distinct (a repeat hides a wrong expert)."""
    return len(set(tokens)) <= len(tokens) // 2
