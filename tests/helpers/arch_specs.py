"""The tiny synthetic model of each architecture gated in tests/gates/test_arch_gates.py (its spec, with a seed whose
resident output is not degenerate); tests/engine/test_arch_layouts.py reads the same specs."""

from __future__ import annotations

from harness.synth import ModelSpec

ARCH_SPECS: dict[str, ModelSpec] = {
    "olmoe": ModelSpec(arch="olmoe", n_head_kv=4, seed=31),
    "granitemoe": ModelSpec(arch="granitemoe", seed=32),
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
