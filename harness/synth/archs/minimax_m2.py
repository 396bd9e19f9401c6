"""minimax-m2 (MiniMax-M2): attention with full-width q/k norms and partial RoPE, sigmoid-gated routed experts
with exp_probs_b in every layer, the experts' width read from feed_forward_length (llama.cpp's minimax-m2
loader, exactly)."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import opts as merge_opts
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "minimax-m2"
OPTS: dict[str, Any] = dict(rope_dim=32)  # rotated dims of a head (the real model: 64 of 128)
SPEC_DEFAULTS: dict[str, Any] = {}
PROBS_BIAS_STD = 0.2


def validate(spec: ModelSpec) -> None:
    r = merge_opts(spec, OPTS)["rope_dim"]
    if r < 2 or r % 2 or r > spec.head_dim:
        raise UserError(f"--arch minimax-m2: rope_dim {r} must be even and at most --head-dim ({spec.head_dim})")


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d, hd = spec.n_embd, spec.head_dim
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    out = [P.embedding(spec)]
    head = P.output(spec)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out += [
            *P.qkvo(spec, il, n_q, n_kv),
            P._ones(p + "attn_norm.weight", d, il),
            P._ones(p + "attn_q_norm.weight", n_q, il),
            P._ones(p + "attn_k_norm.weight", n_kv, il),
            P._ones(p + "ffn_norm.weight", d, il),
            *P.routed(spec, il),
            P.probs_bias(spec, il, PROBS_BIAS_STD),
        ]
    return out[:1] + head + out[1:]


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a = ARCH
    return P.after_model_keys(spec, base, [
        P.u32(f"{a}.feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.expert_gating_func", P.GATING_SIGMOID),
        P.u32(f"{a}.rope.dimension_count", merge_opts(spec, OPTS)["rope_dim"]),
    ])
