"""llama with experts (Mixtral): routed experts in every layer sized by feed_forward_length, softmax gating.
The tiny model carries the optional per-expert `.scale` companions of the three expert tensors (llama.cpp
multiplies each selected expert's output by its scale): they stay resident beside the streamed experts."""

from __future__ import annotations

from harness.synth.archs.common import KV, TensorPlan, _ones, _vec, expert_ff, model_tensors, qkvo, routed, u32
from harness.synth.spec import ModelSpec

# arch_params: n_dense_lead (leading dense blocks), n_nextn (nextn layers, the last ones)
ARCH = "llama"
DENSE_LEAD = 0
NEXTN = 0
SCALE_STD = 1.0


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return model_tensors(spec, layer, check(spec))


def check(spec: ModelSpec) -> list[str]:
    return []


def kvs(spec: ModelSpec) -> list[KV]:
    return [expert_ff(spec), u32(spec, "feed_forward_length", spec.n_ff_exp),
            u32(spec, "rope.dimension_count", spec.head_dim)]


def layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    p = f"blk.{il}."
    scales = [_vec(p + f"ffn_{k}_exps.scale", (spec.n_expert,), SCALE_STD, il) for k in ("gate", "up", "down")]
    return [*qkvo(spec, il), _ones(p + "ffn_norm.weight", spec.n_embd, il), *routed(spec, il), *scales]
