"""granitemoe (IBM Granite 3 MoE): llama-like attention, routed experts in every layer sized by
feed_forward_length; logit_scale is required (the logits are divided by it)."""

from __future__ import annotations

from typing import Any

from harness.synth.archs import _parts as P
from harness.synth.spec import ModelSpec

ARCH = "granitemoe"
SPEC_DEFAULTS: dict[str, Any] = {}


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    return P.override(base, [P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
                             P.u32(f"{a}.feed_forward_length", spec.n_ff_exp), P.f32(f"{a}.logit_scale", 1.0),
                             P.f32(f"{a}.residual_scale", 1.0), P.f32(f"{a}.embedding_scale", 1.0)])


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    return [*P.qkvo(spec, il, norm=True), P._ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il), *P.routed(spec, il)]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
