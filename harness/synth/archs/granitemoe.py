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
    scales = [P.f32(f"{a}.{k}_scale", 1.0) for k in ("logit", "residual", "embedding")]
    return P.override(base, [*P.experts_ff_kvs(spec), *scales])


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    return [*P.qkvo(spec, il, norm=True), P._ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il), *P.routed(spec, il)]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
