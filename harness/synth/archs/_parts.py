"""Tensor groups several arch modules share (pure): the token embedding, output head, attention projections,
routed experts with their router, a shared expert, and the base keys' helpers."""

from __future__ import annotations

import math

from gguf.constants import GGUFValueType as VT

from harness.synth import tokenizer as tok
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import (
    DOWN_GAIN,
    EXPERT_GAIN,
    OUTPUT_GAIN,
    ROUTER_GAIN,
    TensorPlan,
    _experts,
    _lin,
    _ones,
    _vec,
)

__all__ = ["DOWN_GAIN", "EXPERT_GAIN", "TensorPlan", "_lin", "_ones", "_vec"]


def embedding(spec: ModelSpec) -> TensorPlan:
    return TensorPlan("token_embd.weight", (spec.n_embd, spec.n_vocab), spec.dense_type, "normal", 1.0)


def output(spec: ModelSpec, norm: str = "output_norm.weight") -> list[TensorPlan]:
    """The final norm and the output head (control tokens' rows zeroed, so they are never generated)."""
    ctrl = tuple(tok.build_vocab(spec.n_vocab, tok.specials_for(spec.arch, spec.chat_template)).control_ids)
    d = spec.n_embd
    return [
        _ones(norm, d, -1),
        TensorPlan("output.weight", (d, spec.n_vocab), spec.dense_type, "normal", OUTPUT_GAIN / math.sqrt(d), ctrl),
    ]


def qkvo(spec: ModelSpec, il: int, n_q: int, n_kv: int, n_o: int | None = None) -> list[TensorPlan]:
    """attn_q {d, n_q}, attn_k/attn_v {d, n_kv}, attn_output {n_o (default n_q), d}."""
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        _lin(p + "attn_q.weight", d, n_q, dt, il),
        _lin(p + "attn_k.weight", d, n_kv, dt, il),
        _lin(p + "attn_v.weight", d, n_kv, dt, il),
        _lin(p + "attn_output.weight", n_q if n_o is None else n_o, d, dt, il),
    ]


def router(spec: ModelSpec, il: int) -> TensorPlan:
    d = spec.n_embd
    return TensorPlan(f"blk.{il}.ffn_gate_inp.weight", (d, spec.n_expert), "f32", "normal",
                      ROUTER_GAIN / math.sqrt(d), layer=il)


def routed(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    """The router and the routed experts' gate/up/down (streamed)."""
    return [router(spec, il), *_experts(spec, il, spec.n_ff_exp if width is None else width)]


def probs_bias(spec: ModelSpec, il: int) -> TensorPlan:
    """exp_probs_b: a per-expert bias added to the router's probabilities for selection only."""
    return _vec(f"blk.{il}.exp_probs_b.bias", (spec.n_expert,), 0.2, il)


def mlp(spec: ModelSpec, il: int, width: int, suffix: str = "") -> list[TensorPlan]:
    """A SwiGLU MLP: ffn_gate/up/down<suffix> (suffix "_shexp" for a shared expert)."""
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        _lin(p + f"ffn_gate{suffix}.weight", d, width, dt, il, EXPERT_GAIN),
        _lin(p + f"ffn_up{suffix}.weight", d, width, dt, il, EXPERT_GAIN),
        _lin(p + f"ffn_down{suffix}.weight", width, d, dt, il, DOWN_GAIN),
    ]


def u32(key: str, value: int) -> KV:
    return KV(key, VT.UINT32, int(value))


def u32_array(key: str, values: list[int]) -> KV:
    return KV(key, VT.ARRAY, [int(v) for v in values], VT.UINT32)


def without(kvs: list[KV], *suffixes: str) -> list[KV]:
    """kvs minus the keys ending in any of the suffixes."""
    return [kv for kv in kvs if not kv.key.endswith(suffixes)]


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers a K-quant _M mix gives a bigger type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def k_mix(tensors: list[TensorPlan], more_bits_type: str, embd_type: str, n_blocks: int) -> list[TensorPlan]:
    """The part of llama.cpp's Q4_K_M/Q5_K_M type choice that moves file sizes: every ffn_down* (dense, routed,
    shared) of a use_more_bits layer and the attn_v of a use_more_bits attention layer in `more_bits_type`, the
    token embedding in `embd_type` ("" leaves either alone)."""
    import dataclasses

    wv = sorted(t.layer for t in tensors if t.name.endswith(".attn_v.weight"))
    out = []
    for t in tensors:
        new = ""
        if more_bits_type and ".ffn_down" in t.name and more_bits(t.layer, n_blocks):
            new = more_bits_type
        elif more_bits_type and t.name.endswith(".attn_v.weight") and more_bits(wv.index(t.layer), len(wv)):
            new = more_bits_type
        elif embd_type and t.name == "token_embd.weight":
            new = embd_type
        out.append(dataclasses.replace(t, dtype=new, init="blocks") if new and new != t.dtype else t)
    return out
