"""bailingmoe2 (Ling 2.0): fused attn_qkv, q/k norms, leading dense blocks, routed experts (the gating function
key is required) with the optional exp_probs_b selection bias and a shared expert."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.spec import ModelSpec

ARCH = "bailingmoe2"
SPEC_DEFAULTS: dict[str, Any] = {}
PARAMS: dict[str, int] = dict(n_dense_lead=1)  # leading dense blocks


def validate(spec: ModelSpec) -> None:
    if spec.n_head * spec.head_dim != spec.n_embd:
        raise UserError(f"--arch bailingmoe2 needs --heads x --head-dim == --embd ({spec.n_head} x {spec.head_dim} "
                        f"!= {spec.n_embd}): its fused q/k/v sizes q as n_embd")


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    own = [*P.lead_kvs(spec, param(spec, PARAMS, "n_dense_lead")), P.u32(f"{ARCH}.feed_forward_length", spec.n_ff),
           *P.sigmoid_shared_kvs(spec)]
    return P.override(base, own)


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    n_kv = spec.n_head_kv * spec.head_dim
    return [P._ones(p + "attn_norm.weight", d, il), P._lin(p + "attn_qkv.weight", d, d + 2 * n_kv, dt, il),
            P._lin(p + "attn_output.weight", spec.n_head * spec.head_dim, d, dt, il), *P.qk_norms(spec, il),
            P._ones(p + "ffn_norm.weight", d, il),
            *P.lead_dense_ffn(spec, il, param(spec, PARAMS, "n_dense_lead"), spec.n_ff_exp)]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
