"""deepseek2 (DeepSeek V2/V3/R1): multi-head latent attention in its unsplit form (attn_kv_a_mqa, attn_kv_b;
no q LoRA), leading dense blocks, routed experts in two groups of which one is used per token, a shared
expert, sigmoid gating with the exp_probs_b selection bias."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.spec import ModelSpec

ARCH = "deepseek2"
SPEC_DEFAULTS: dict[str, Any] = dict(n_head_kv=4)  # the latent KV expands to every head
PARAMS: dict[str, int] = dict(n_dense_lead=1)  # leading dense blocks
KV_LORA = 64  # compressed KV width
ROPE_DIM = 32  # the rotary part of each query/key head; head_dim is the rest (no-PE part)
GROUPS, GROUPS_USED = 2, 1


def _k_head(spec: ModelSpec) -> int:
    return spec.head_dim + ROPE_DIM


def validate(spec: ModelSpec) -> None:
    if spec.n_expert % GROUPS:
        raise UserError(f"--arch deepseek2 routes in {GROUPS} expert groups: --experts must be a multiple of {GROUPS}")
    if spec.n_expert_used > spec.n_expert // GROUPS * GROUPS_USED:
        raise UserError(f"--arch deepseek2 picks its top-k inside {GROUPS_USED} of {GROUPS} groups: --top-k must be "
                        f"at most {spec.n_expert // GROUPS * GROUPS_USED}")
    if spec.n_head_kv != spec.n_head:
        raise UserError("--arch deepseek2 needs --heads-kv == --heads (its latent KV expands to every head)")


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    own = [
        *P.lead_kvs(spec, param(spec, PARAMS, "n_dense_lead")),
        P.u32(f"{a}.feed_forward_length", spec.n_ff),
        P.u32(f"{a}.attention.q_lora_rank", 0),
        P.u32(f"{a}.attention.kv_lora_rank", KV_LORA),
        P.u32(f"{a}.attention.key_length", _k_head(spec)),
        P.u32(f"{a}.attention.value_length", spec.head_dim),
        P.u32(f"{a}.rope.dimension_count", ROPE_DIM),
        *P.sigmoid_shared_kvs(spec),
        P.u32(f"{a}.expert_group_count", GROUPS),
        P.u32(f"{a}.expert_group_used_count", GROUPS_USED),
    ]
    return P.override(base, own)


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    d, dt, hd, h = spec.n_embd, spec.dense_type, spec.head_dim, spec.n_head
    p = f"blk.{il}."
    return [
        P._ones(p + "attn_norm.weight", d, il),
        P._ones(p + "attn_kv_a_norm.weight", KV_LORA, il),
        P._lin(p + "attn_q.weight", d, h * _k_head(spec), dt, il),
        P._lin(p + "attn_kv_a_mqa.weight", d, KV_LORA + ROPE_DIM, dt, il),
        P._lin(p + "attn_kv_b.weight", KV_LORA, h * (hd + hd), dt, il),
        P._lin(p + "attn_output.weight", h * hd, d, dt, il),
        P._ones(p + "ffn_norm.weight", d, il),
        *P.lead_dense_ffn(spec, il, param(spec, PARAMS, "n_dense_lead"), spec.n_ff_exp),
    ]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
