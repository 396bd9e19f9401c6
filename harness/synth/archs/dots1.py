"""dots1 (dots.llm1): q/k norms, full multi-head attention (no GQA), leading dense blocks, routed experts with
sigmoid gating and the optional exp_probs_b selection bias, a shared expert (n_ff_exp x expert_shared_count)."""

from __future__ import annotations

from harness.synth.archs.common import (
    KV,
    TensorPlan,
    _ones,
    boolean,
    dense_ffn,
    expert_ff,
    lead,
    model_tensors,
    probs_bias,
    qk_norms,
    qkvo,
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "dots1"
DENSE_LEAD = 1
NEXTN = 0
GATING_SIGMOID = 2


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    return [] if spec.n_head_kv == spec.n_head else ["--arch dots1 needs --heads-kv == --heads (its k/v span "
                                                     "every head)"]


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
    out = [*qkvo(spec, il), *qk_norms(spec, il), _ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il)]
    if il < lead(spec, DENSE_LEAD):
        return out + dense_ffn(spec, il)
    return out + [probs_bias(spec, il), *routed(spec, il), *shared(spec, il, spec.n_ff_exp)]
