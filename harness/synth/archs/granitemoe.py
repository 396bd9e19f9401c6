"""granitemoe (IBM Granite 3 MoE): llama-like attention, routed experts in every layer sized by
feed_forward_length; logit_scale is required (the logits are divided by it)."""

from __future__ import annotations

from harness.synth.archs.common import KV, TensorPlan, _ones, f32, qkvo, routed, u32
from harness.synth.spec import ModelSpec

ARCH = "granitemoe"
DENSE_LEAD = 0
NEXTN = 0


def check(spec: ModelSpec) -> list[str]:
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [u32(spec, "feed_forward_length", spec.n_ff_exp), f32(spec, "logit_scale", 1.0),
            f32(spec, "residual_scale", 1.0), f32(spec, "embedding_scale", 1.0)]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    return [*qkvo(spec, il), _ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il), *routed(spec, il)]
