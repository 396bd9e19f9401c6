"""glm4moe (GLM-4.5): q/k/v with biases, a post-attention norm as the FFN's input norm, leading dense blocks,
routed experts with sigmoid gating and the exp_probs_b selection bias, a shared expert, and a nextn (MTP) layer
counted in block_count: its tensors are in the file (llama.cpp loads them only for MTP) but it is not part of
the trunk's graph."""

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
    nextn,
    nextn_block,
    probs_bias,
    qkvo,
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "glm4moe"
DENSE_LEAD = 1
NEXTN = 1
GATING_SIGMOID = 2


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    n = nextn(spec, NEXTN)
    out = [] if n <= 1 else ["--arch glm4moe: llama.cpp supports a single nextn (MTP) layer"]
    if spec.n_layer - n <= lead(spec, DENSE_LEAD):
        out.append("--arch glm4moe: --layers leaves no MoE layer in the trunk (1 leading dense, 1 nextn)")
    return out


def kvs(spec: ModelSpec) -> list[KV]:
    return [
        expert_ff(spec),
        u32(spec, "leading_dense_block_count", lead(spec, DENSE_LEAD)),
        u32(spec, "nextn_predict_layers", nextn(spec, NEXTN)),
        u32(spec, "feed_forward_length", spec.n_ff),
        u32(spec, "expert_shared_count", 1),
        boolean(spec, "expert_weights_norm", True),
        u32(spec, "expert_gating_func", GATING_SIGMOID),
    ]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    out = [*qkvo(spec, il, bias=True), _ones(f"blk.{il}.post_attention_norm.weight", spec.n_embd, il)]
    if il < lead(spec, DENSE_LEAD):
        out += dense_ffn(spec, il)
    else:
        out += [probs_bias(spec, il), *routed(spec, il), *shared(spec, il, spec.n_ff_exp)]
    if il >= spec.n_layer - nextn(spec, NEXTN):
        out += nextn_block(spec, il)
    return out
