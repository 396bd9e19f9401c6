"""Tensor groups and metadata helpers the arch modules share (pure): the token embedding and output head,
attention projections, routed experts with their router and selection bias, SwiGLU MLPs (dense or shared expert),
the leading-dense / shared-expert FFN of the DeepSeek-style layouts, nextn (MTP) blocks, and key helpers."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from gguf.constants import GGUFValueType as VT

from harness.synth import tokenizer as tok
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import (
    DOWN_GAIN,
    EXPERT_GAIN,
    OUTPUT_GAIN,
    ROUTER_BIAS_STD,
    ROUTER_GAIN,
    SINK_STD,
    TensorPlan,
    _experts,
    _lin,
    _ones,
    _vec,
)

__all__ = ["DOWN_GAIN", "EXPERT_GAIN", "KV", "ROUTER_BIAS_STD", "ROUTER_GAIN", "SINK_STD", "TensorPlan", "_experts",
           "_lin", "_ones", "_vec"]

GATING_SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID


def control_ids(spec: ModelSpec) -> tuple[int, ...]:
    """The vocabulary's control tokens: their output-head (or tied-embedding) rows are zero, never generated."""
    return tuple(tok.build_vocab(spec.n_vocab, tok.specials_for(spec.arch, spec.chat_template)).control_ids)


def embedding(spec: ModelSpec) -> TensorPlan:
    return TensorPlan("token_embd.weight", (spec.n_embd, spec.n_vocab), spec.dense_type, "normal", 1.0)


def output(spec: ModelSpec, norm: str = "output_norm.weight") -> list[TensorPlan]:
    """The final norm and the output head (control tokens' rows zeroed, so they are never generated)."""
    d = spec.n_embd
    return [
        _ones(norm, d, -1),
        TensorPlan("output.weight", (d, spec.n_vocab), spec.dense_type, "normal", OUTPUT_GAIN / math.sqrt(d),
                   control_ids(spec)),
    ]


def bigram_embedding(plans: list[TensorPlan], gain: int) -> list[TensorPlan]:
    """The token embedding `gain` times larger (nextn_block's `bigram`); unchanged for 0."""
    if not gain:
        return plans
    return [dataclasses.replace(t, std=t.std * gain) if t.name == "token_embd.weight" else t for t in plans]


def model_tensors(spec: ModelSpec, layer: Callable[[ModelSpec, int], list[TensorPlan]]) -> list[TensorPlan]:
    """The whole file: the embedding, `layer(spec, il)` for every block, the output norm and head."""
    out = [embedding(spec)]
    for il in range(spec.n_layer):
        out += layer(spec, il)
    return out + output(spec)


def qkvo(spec: ModelSpec, il: int, n_q: int | None = None, n_kv: int | None = None, n_o: int | None = None,
         *, norm: bool = False, bias: bool = False) -> list[TensorPlan]:
    """[attn_norm], attn_q {d, n_q}, attn_k/attn_v {d, n_kv}, [their biases], attn_output {n_o, d}; n_q, n_kv
    default to the heads times head_dim, n_o to n_q."""
    d, dt, hd, p = spec.n_embd, spec.dense_type, spec.head_dim, f"blk.{il}."
    n_q = spec.n_head * hd if n_q is None else n_q
    n_kv = spec.n_head_kv * hd if n_kv is None else n_kv
    out = [_ones(p + "attn_norm.weight", d, il)] if norm else []
    out += [_lin(p + "attn_q.weight", d, n_q, dt, il),
            _lin(p + "attn_k.weight", d, n_kv, dt, il),
            _lin(p + "attn_v.weight", d, n_kv, dt, il)]
    if bias:
        out += [_vec(p + "attn_q.bias", (n_q,), 0.1, il), _vec(p + "attn_k.bias", (n_kv,), 0.1, il),
                _vec(p + "attn_v.bias", (n_kv,), 0.1, il)]
    return out + [_lin(p + "attn_output.weight", n_q if n_o is None else n_o, d, dt, il)]


def qk_norms(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    w = spec.head_dim if width is None else width
    return [_ones(f"blk.{il}.attn_q_norm.weight", w, il), _ones(f"blk.{il}.attn_k_norm.weight", w, il)]


def router(spec: ModelSpec, il: int) -> TensorPlan:
    d = spec.n_embd
    return TensorPlan(f"blk.{il}.ffn_gate_inp.weight", (d, spec.n_expert), "f32", "normal",
                      ROUTER_GAIN / math.sqrt(d), layer=il)


def routed(spec: ModelSpec, il: int, width: int | None = None) -> list[TensorPlan]:
    """The router and the routed experts' gate/up/down (streamed)."""
    return [router(spec, il), *_experts(spec, il, spec.n_ff_exp if width is None else width)]


def probs_bias(spec: ModelSpec, il: int, std: float) -> TensorPlan:
    """exp_probs_b: a per-expert bias added to the router's probabilities for selection only (DeepSeek V3's)."""
    return _vec(f"blk.{il}.exp_probs_b.bias", (spec.n_expert,), std, il)


def mlp(spec: ModelSpec, il: int, width: int, suffix: str = "") -> list[TensorPlan]:
    """A SwiGLU MLP: ffn_gate/up/down<suffix> (suffix "_shexp" for a shared expert)."""
    d, dt, p = spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        _lin(p + f"ffn_gate{suffix}.weight", d, width, dt, il, EXPERT_GAIN),
        _lin(p + f"ffn_up{suffix}.weight", d, width, dt, il, EXPERT_GAIN),
        _lin(p + f"ffn_down{suffix}.weight", width, d, dt, il, DOWN_GAIN),
    ]


def gated_shared_moe(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """The router and routed experts, then a shared expert (n_ff_shexp wide) with its one-logit sigmoid gate."""
    d = spec.n_embd
    return [
        *routed(spec, il),
        TensorPlan(f"blk.{il}.ffn_gate_inp_shexp.weight", (d,), "f32", "normal", 1.0 / math.sqrt(d), layer=il),
        *mlp(spec, il, spec.n_ff_shexp, "_shexp"),
    ]


def lead_dense_ffn(spec: ModelSpec, il: int, n_lead: int, shared_width: int) -> list[TensorPlan]:
    """The FFN of the DeepSeek-style layouts: a dense SwiGLU MLP (n_ff) in the first `n_lead` blocks, else
    exp_probs_b, the router and routed experts, and a shared expert `shared_width` wide."""
    if il < n_lead:
        return mlp(spec, il, spec.n_ff)
    return [probs_bias(spec, il, ROUTER_BIAS_STD), *routed(spec, il), *mlp(spec, il, shared_width, "_shexp")]


def nextn_block(spec: ModelSpec, il: int, bigram: int = 0) -> list[TensorPlan]:
    """The nextn (MTP) extras of a block past the trunk: eh_proj and its two norms (the optional embedding and
    head copies are left out: llama.cpp falls back to the model's own). `bigram` > 0: eh_proj is `bigram` times
    the identity on the token's (normed) embedding and drops the trunk's hidden state; with the embedding as
    many times larger (`bigram_embedding`), both the trunk and the head then predict about what the output head
    makes of the token's own embedding, so the head's drafts are often right (a random eh_proj's almost never)."""
    d, p = spec.n_embd, f"blk.{il}.nextn."
    eh = (TensorPlan(p + "eh_proj.weight", (2 * d, d), spec.dense_type, "eye", float(bigram), layer=il) if bigram
          else _lin(p + "eh_proj.weight", 2 * d, d, spec.dense_type, il))
    return [
        eh,
        _ones(p + "enorm.weight", d, il),
        _ones(p + "hnorm.weight", d, il),
    ]


def u32(key: str, value: int) -> KV:
    return KV(key, VT.UINT32, int(value))


def f32(key: str, value: float) -> KV:
    return KV(key, VT.FLOAT32, float(value))


def boolean(key: str, value: bool) -> KV:
    return KV(key, VT.BOOL, bool(value))


def u32_array(key: str, values: list[int]) -> KV:
    return KV(key, VT.ARRAY, [int(v) for v in values], VT.UINT32)


def experts_ff_kvs(spec: ModelSpec) -> list[KV]:
    """The experts' width as expert_feed_forward_length and as feed_forward_length (the archs that read it there)."""
    a = spec.arch
    return [u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp), u32(f"{a}.feed_forward_length", spec.n_ff_exp)]


def lead_kvs(spec: ModelSpec, n_lead: int) -> list[KV]:
    """The experts' width and the leading dense block count (the DeepSeek-style layouts' first keys)."""
    a = spec.arch
    return [u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp), u32(f"{a}.leading_dense_block_count", n_lead)]


def sigmoid_shared_kvs(spec: ModelSpec) -> list[KV]:
    """One shared expert, normalised sigmoid routing weights."""
    a = spec.arch
    return [u32(f"{a}.expert_shared_count", 1), boolean(f"{a}.expert_weights_norm", True),
            u32(f"{a}.expert_gating_func", GATING_SIGMOID)]


def without(kvs: list[KV], *suffixes: str) -> list[KV]:
    """kvs minus the keys ending in any of the suffixes."""
    return [kv for kv in kvs if not kv.key.endswith(suffixes)]


def override(kvs: list[KV], own: list[KV]) -> list[KV]:
    """kvs with each key of `own` replacing the one of the same name in place, the others appended."""
    by_key = {kv.key: kv for kv in own}
    return [by_key.pop(kv.key, kv) for kv in kvs] + list(by_key.values())


def after_model_keys(spec: ModelSpec, base: list[KV], own: list[KV], drop: tuple[str, ...] = ()) -> list[KV]:
    """base with its model keys (those before the expert counts and the tokenizer) ending in `drop` removed and
    `own` placed after them."""
    i = next(i for i, kv in enumerate(base) if kv.key == f"{spec.arch}.expert_count" or kv.key.startswith("tokenizer."))
    return without(base[:i], *drop) + own + base[i:]


def before_tokenizer(base: list[KV], own: list[KV]) -> list[KV]:
    """base with `own` placed before the tokenizer's keys."""
    i = next(i for i, kv in enumerate(base) if kv.key.startswith("tokenizer."))
    return base[:i] + own + base[i:]


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits (llama-quant.cpp): the layers a K-quant _M mix gives a bigger type."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def k_mix(tensors: list[TensorPlan], more_bits_type: str, embd_type: str, n_blocks: int) -> list[TensorPlan]:
    """The part of llama.cpp's Q4_K_M/Q5_K_M type choice that moves file sizes: every ffn_down* (dense, routed,
    shared) of a use_more_bits layer and the attn_v of a use_more_bits attention layer in `more_bits_type`, the
    token embedding in `embd_type` ("" leaves either alone)."""
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
