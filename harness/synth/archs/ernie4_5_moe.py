"""ernie4_5-moe (ERNIE 4.5 MoE): leading dense blocks, then routed experts in every layer (interleave step 1)
with the optional exp_probs_b selection bias and a shared expert (expert_shared_feed_forward_length)."""

from __future__ import annotations

from harness.synth.archs.common import (
    KV,
    TensorPlan,
    _ones,
    dense_ffn,
    expert_ff,
    lead,
    model_tensors,
    probs_bias,
    qkvo,
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "ernie4_5-moe"
DENSE_LEAD = 1
NEXTN = 0


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [
        expert_ff(spec),
        u32(spec, "leading_dense_block_count", lead(spec, DENSE_LEAD)),
        u32(spec, "interleave_moe_layer_step", 1),
        u32(spec, "feed_forward_length", spec.n_ff),
        u32(spec, "expert_shared_feed_forward_length", spec.n_ff_shexp),
    ]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    out = [*qkvo(spec, il), _ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il)]
    if il < lead(spec, DENSE_LEAD):
        return out + dense_ffn(spec, il)
    return out + [probs_bias(spec, il), *routed(spec, il), *shared(spec, il, spec.n_ff_shexp)]
