"""hunyuan-moe (Hunyuan-A13B): q/k norms, routed experts in every layer sized by feed_forward_length, and a
shared expert (expert_shared_feed_forward_length) beside them."""

from __future__ import annotations

from typing import Any

from harness.synth.archs import _parts as P
from harness.synth.spec import ModelSpec

ARCH = "hunyuan-moe"
SPEC_DEFAULTS: dict[str, Any] = {}


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    return P.override(base, [*P.experts_ff_kvs(spec), P.u32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)])


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    return [*P.qkvo(spec, il, norm=True), *P.qk_norms(spec, il), P._ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il),
            *P.routed(spec, il), *P.mlp(spec, il, spec.n_ff_shexp, "_shexp")]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
