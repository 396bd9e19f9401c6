"""llama with experts (Mixtral): routed experts in every layer sized by feed_forward_length, softmax gating.
The tiny model carries the optional per-expert `.scale` companions of the three expert tensors (llama.cpp
multiplies each selected expert's output by its scale): they stay resident beside the streamed experts."""

from __future__ import annotations

from typing import Any

from harness.synth.archs import _parts as P
from harness.synth.spec import ModelSpec

ARCH = "llama"
SPEC_DEFAULTS: dict[str, Any] = {}
SCALE_STD = 1.0


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    return P.override(base, [*P.experts_ff_kvs(spec), P.u32(f"{a}.rope.dimension_count", spec.head_dim)])


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    p = f"blk.{il}."
    scales = [P._vec(p + f"ffn_{k}_exps.scale", (spec.n_expert,), SCALE_STD, il) for k in ("gate", "up", "down")]
    return [*P.qkvo(spec, il, norm=True), P._ones(p + "ffn_norm.weight", spec.n_embd, il), *P.routed(spec, il),
            *scales]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
