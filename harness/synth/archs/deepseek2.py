"""deepseek2 (DeepSeek V2/V3/R1): multi-head latent attention in its unsplit form (attn_kv_a_mqa, attn_kv_b;
no q LoRA), leading dense blocks, routed experts in two groups of which one is used per token, a shared
expert, sigmoid gating with the exp_probs_b selection bias."""

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
    routed,
    shared,
    u32,
)
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "deepseek2"
DENSE_LEAD = 1
NEXTN = 0
KV_LORA = 64  # compressed KV width
ROPE_DIM = 32  # the rotary part of each query/key head; head_dim is the rest (no-PE part)
GROUPS, GROUPS_USED = 2, 1
GATING_SIGMOID = 2


def _k_head(spec: ModelSpec) -> int:
    return spec.head_dim + ROPE_DIM


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    out = []
    if spec.n_expert % GROUPS:
        out.append(f"--arch deepseek2 routes in {GROUPS} expert groups: --experts must be a multiple of {GROUPS}")
    elif spec.n_expert_used > spec.n_expert // GROUPS * GROUPS_USED:
        out.append(f"--arch deepseek2 picks its top-k inside {GROUPS_USED} of {GROUPS} groups: --top-k must be at "
                   f"most {spec.n_expert // GROUPS * GROUPS_USED}")
    if spec.n_head_kv != spec.n_head:
        out.append("--arch deepseek2 needs --heads-kv == --heads (its latent KV expands to every head)")
    return out


def kvs(spec: ModelSpec) -> list[KV]:
    return [
        expert_ff(spec),
        u32(spec, "leading_dense_block_count", lead(spec, DENSE_LEAD)),
        u32(spec, "feed_forward_length", spec.n_ff),
        u32(spec, "attention.q_lora_rank", 0),
        u32(spec, "attention.kv_lora_rank", KV_LORA),
        u32(spec, "attention.key_length", _k_head(spec)),
        u32(spec, "attention.value_length", spec.head_dim),
        u32(spec, "rope.dimension_count", ROPE_DIM),
        u32(spec, "expert_shared_count", 1),
        boolean(spec, "expert_weights_norm", True),
        u32(spec, "expert_gating_func", GATING_SIGMOID),
        u32(spec, "expert_group_count", GROUPS),
        u32(spec, "expert_group_used_count", GROUPS_USED),
    ]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    d, dt, hd, h = spec.n_embd, spec.dense_type, spec.head_dim, spec.n_head
    p = f"blk.{il}."
    out = [
        _ones(p + "attn_norm.weight", d, il),
        _ones(p + "attn_kv_a_norm.weight", KV_LORA, il),
        _lin(p + "attn_q.weight", d, h * _k_head(spec), dt, il),
        _lin(p + "attn_kv_a_mqa.weight", d, KV_LORA + ROPE_DIM, dt, il),
        _lin(p + "attn_kv_b.weight", KV_LORA, h * (hd + hd), dt, il),
        _lin(p + "attn_output.weight", h * hd, d, dt, il),
        _ones(p + "ffn_norm.weight", d, il),
    ]
    if il < lead(spec, DENSE_LEAD):
        return out + dense_ffn(spec, il)
    return out + [probs_bias(spec, il), *routed(spec, il), *shared(spec, il, spec.n_ff_exp)]
