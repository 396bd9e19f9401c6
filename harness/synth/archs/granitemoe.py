"""granitemoe (IBM Granite 3 MoE): llama-like attention, routed experts in every layer sized by
feed_forward_length; logit_scale is required (the logits are divided by it)."""

from __future__ import annotations

from harness.synth.archs.common import KV, TensorPlan, _ones, expert_ff, f32, model_tensors, qkvo, routed, u32
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "granitemoe"
DENSE_LEAD = 0
NEXTN = 0


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [expert_ff(spec), u32(spec, "feed_forward_length", spec.n_ff_exp), f32(spec, "logit_scale", 1.0),
            f32(spec, "residual_scale", 1.0), f32(spec, "embedding_scale", 1.0)]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    return [*qkvo(spec, il), _ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il), *routed(spec, il)]
