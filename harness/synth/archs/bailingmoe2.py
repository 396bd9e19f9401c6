"""bailingmoe2 (Ling 2.0): fused attn_qkv, q/k norms, leading dense blocks, routed experts (the gating function
key is required) with the optional exp_probs_b selection bias and a shared expert."""

from __future__ import annotations

from harness.synth.archs.common import (
    KV,
    TensorPlan,
    _lin,
    _ones,
    boolean,
    dense_ffn,
    expert_ff,
    lead,
    model_tensors,
    probs_bias,
    qk_norms,
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "bailingmoe2"
DENSE_LEAD = 1
NEXTN = 0
GATING_SIGMOID = 2


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    if spec.n_head * spec.head_dim != spec.n_embd:
        return [f"--arch bailingmoe2 needs --heads x --head-dim == --embd ({spec.n_head} x {spec.head_dim} != "
                f"{spec.n_embd}): its fused q/k/v sizes q as n_embd"]
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [
        expert_ff(spec),
        u32(spec, "leading_dense_block_count", lead(spec, DENSE_LEAD)),
        u32(spec, "feed_forward_length", spec.n_ff),
        u32(spec, "expert_shared_count", 1),
        boolean(spec, "expert_weights_norm", True),
        u32(spec, "expert_gating_func", GATING_SIGMOID),
    ]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    n_kv = spec.n_head_kv * spec.head_dim
    out = [_ones(p + "attn_norm.weight", d, il), _lin(p + "attn_qkv.weight", d, d + 2 * n_kv, dt, il),
           _lin(p + "attn_output.weight", spec.n_head * spec.head_dim, d, dt, il), *qk_norms(spec, il),
           _ones(p + "ffn_norm.weight", d, il)]
    if il < lead(spec, DENSE_LEAD):
        return out + dense_ffn(spec, il)
    return out + [probs_bias(spec, il), *routed(spec, il), *shared(spec, il, spec.n_ff_exp)]
