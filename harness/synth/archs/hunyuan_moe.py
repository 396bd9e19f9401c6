"""hunyuan-moe (Hunyuan-A13B): q/k norms, routed experts in every layer sized by feed_forward_length, and a
shared expert (expert_shared_feed_forward_length) beside them."""

from __future__ import annotations

from harness.synth.archs.common import (
    KV,
    TensorPlan,
    _ones,
    expert_ff,
    model_tensors,
    qk_norms,
    qkvo,
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "hunyuan-moe"
DENSE_LEAD = 0
NEXTN = 0


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [expert_ff(spec), u32(spec, "feed_forward_length", spec.n_ff_exp),
            u32(spec, "expert_shared_feed_forward_length", spec.n_ff_shexp)]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    return [*qkvo(spec, il), *qk_norms(spec, il), _ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il),
            *routed(spec, il), *shared(spec, il, spec.n_ff_shexp)]
