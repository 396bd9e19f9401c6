"""Building blocks shared by the per-architecture layouts (pure): attention, router, routed and shared experts,
dense FFN blocks, and the metadata helpers."""

from __future__ import annotations

import math
from collections.abc import Callable

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth import tokenizer as tok
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import (
    DOWN_GAIN,
    EXPERT_GAIN,
    OUTPUT_GAIN,
    ROUTER_BIAS_STD,
    ROUTER_GAIN,
    TensorPlan,
    _experts,
    _lin,
    _ones,
    _vec,
)

__all__ = ["KV", "TensorPlan", "_experts", "_lin", "_ones", "_vec"]


def u32(spec: ModelSpec, key: str, v: int) -> KV:
    return KV(f"{spec.arch}.{key}", VT.UINT32, int(v))


def f32(spec: ModelSpec, key: str, v: float) -> KV:
    return KV(f"{spec.arch}.{key}", VT.FLOAT32, float(v))


def boolean(spec: ModelSpec, key: str, v: bool) -> KV:
    return KV(f"{spec.arch}.{key}", VT.BOOL, bool(v))


def lead(spec: ModelSpec, default: int) -> int:
    """Leading dense blocks (no experts): arch_params n_dense_lead, else the arch's default."""
    return spec.param("n_dense_lead", default)


def nextn(spec: ModelSpec, default: int) -> int:
    """nextn (MTP) layers, the last of n_layer: arch_params n_nextn, else the arch's default."""
    return spec.param("n_nextn", default)


def expert_ff(spec: ModelSpec) -> KV:
    return u32(spec, "expert_feed_forward_length", spec.n_ff_exp)


def model_tensors(spec: ModelSpec, layer: Callable[[ModelSpec, int], list[TensorPlan]], problems: list[str]
                  ) -> list[TensorPlan]:
    """The whole file: embeddings, `layer(spec, il)` for every block, the output norm and head (whose rows of
    control tokens are zero, as tensors.py does); the first of `problems` refused as a UserError."""
    if problems:
        raise UserError(problems[0])
    ctrl = tuple(tok.build_vocab(spec.n_vocab, tok.specials_for(spec.arch, spec.chat_template)).control_ids)
    d = spec.n_embd
    out = [TensorPlan("token_embd.weight", (d, spec.n_vocab), spec.dense_type, "normal", 1.0)]
    for il in range(spec.n_layer):
        out += layer(spec, il)
    out.append(_ones("output_norm.weight", d, -1))
    out.append(TensorPlan("output.weight", (d, spec.n_vocab), spec.dense_type, "normal", OUTPUT_GAIN / math.sqrt(d),
                          ctrl))
    return out


def qkvo(spec: ModelSpec, il: int, n_q: int | None = None, n_kv: int | None = None, bias: bool = False
         ) -> list[TensorPlan]:
    """attn_norm, separate q/k/v (optionally with biases) and the output projection."""
    d, dt, hd = spec.n_embd, spec.dense_type, spec.head_dim
    n_q = spec.n_head * hd if n_q is None else n_q
    n_kv = spec.n_head_kv * hd if n_kv is None else n_kv
    p = f"blk.{il}."
    out = [_ones(p + "attn_norm.weight", d, il),
           _lin(p + "attn_q.weight", d, n_q, dt, il),
           _lin(p + "attn_k.weight", d, n_kv, dt, il),
           _lin(p + "attn_v.weight", d, n_kv, dt, il)]
    if bias:
        out += [_vec(p + "attn_q.bias", (n_q,), 0.1, il), _vec(p + "attn_k.bias", (n_kv,), 0.1, il),
                _vec(p + "attn_v.bias", (n_kv,), 0.1, il)]
    return out + [_lin(p + "attn_output.weight", n_q, d, dt, il)]


def qk_norms(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    w = spec.head_dim if width is None else width
    return [_ones(f"blk.{il}.attn_q_norm.weight", w, il), _ones(f"blk.{il}.attn_k_norm.weight", w, il)]


def router(spec: ModelSpec, il: int) -> TensorPlan:
    d = spec.n_embd
    return TensorPlan(f"blk.{il}.ffn_gate_inp.weight", (d, spec.n_expert), "f32", "normal", ROUTER_GAIN / math.sqrt(d),
                      layer=il)


def probs_bias(spec: ModelSpec, il: int) -> TensorPlan:
    """exp_probs_b: added to the routing probabilities for the selection only (DeepSeek V3's bias)."""
    return _vec(f"blk.{il}.exp_probs_b.bias", (spec.n_expert,), ROUTER_BIAS_STD, il)


def routed(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    """The router and the routed experts (gate, up, down)."""
    return [router(spec, il), *_experts(spec, il, spec.n_ff_exp if width is None else width)]


def shared(spec: ModelSpec, il: int, width: int) -> list[TensorPlan]:
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    return [_lin(p + "ffn_gate_shexp.weight", d, width, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_up_shexp.weight", d, width, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_down_shexp.weight", width, d, dt, il, DOWN_GAIN)]


def dense_ffn(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    """A dense block's FFN (a leading dense layer): ffn_gate/up/down."""
    d, dt, p, w = spec.n_embd, spec.dense_type, f"blk.{il}.", spec.n_ff if width is None else width
    return [_lin(p + "ffn_gate.weight", d, w, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_up.weight", d, w, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_down.weight", w, d, dt, il, DOWN_GAIN)]


def nextn_block(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """The nextn (MTP) extras of a layer past the trunk: eh_proj and its two norms (the optional embedding and
    head copies are left out: llama.cpp falls back to the model's own)."""
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}.nextn."
    return [_lin(p + "eh_proj.weight", 2 * d, d, dt, il), _ones(p + "enorm.weight", d, il),
            _ones(p + "hnorm.weight", d, il)]
