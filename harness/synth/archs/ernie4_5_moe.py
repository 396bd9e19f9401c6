"""ernie4_5-moe (ERNIE 4.5 MoE): leading dense blocks, then routed experts in every layer (interleave step 1)
with the optional exp_probs_b selection bias and a shared expert (expert_shared_feed_forward_length)."""

from __future__ import annotations

from typing import Any

from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.spec import ModelSpec

ARCH = "ernie4_5-moe"
SPEC_DEFAULTS: dict[str, Any] = {}
PARAMS: dict[str, int] = dict(n_dense_lead=1)  # leading dense blocks


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    own = [*P.lead_kvs(spec, param(spec, PARAMS, "n_dense_lead")), P.u32(f"{a}.interleave_moe_layer_step", 1),
           P.u32(f"{a}.feed_forward_length", spec.n_ff),
           P.u32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)]
    return P.override(base, own)


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    return [*P.qkvo(spec, il, norm=True), P._ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il),
            *P.lead_dense_ffn(spec, il, param(spec, PARAMS, "n_dense_lead"), spec.n_ff_shexp)]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
