"""dots1 (dots.llm1): q/k norms, full multi-head attention (no GQA), leading dense blocks, routed experts with
sigmoid gating and the optional exp_probs_b selection bias, a shared expert (n_ff_exp x expert_shared_count)."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.spec import ModelSpec

ARCH = "dots1"
SPEC_DEFAULTS: dict[str, Any] = dict(n_head_kv=4)  # k/v over every head
PARAMS: dict[str, int] = dict(n_dense_lead=1)  # leading dense blocks


def validate(spec: ModelSpec) -> None:
    if spec.n_head_kv != spec.n_head:
        raise UserError("--arch dots1 needs --heads-kv == --heads (its k/v span every head)")


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    own = [*P.lead_kvs(spec, param(spec, PARAMS, "n_dense_lead")), P.u32(f"{ARCH}.feed_forward_length", spec.n_ff),
           *P.sigmoid_shared_kvs(spec)]
    return P.override(base, own)


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    return [*P.qkvo(spec, il, norm=True), *P.qk_norms(spec, il), P._ones(f"blk.{il}.ffn_norm.weight", spec.n_embd, il),
            *P.lead_dense_ffn(spec, il, param(spec, PARAMS, "n_dense_lead"), spec.n_ff_exp)]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.model_tensors(spec, layer)
