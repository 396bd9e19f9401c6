"""The layout of the archs without a module of their own (qwen3moe, qwen2moe, gpt-oss, qwen3 and olmoe), in the
arch modules' convention (`tensors`, `kvs`), and `layout(arch)`, the module that lays out an arch (pure). The
tensor set must be exactly what llama.cpp's loader creates for the arch (an extra tensor is fatal)."""

from __future__ import annotations

import sys
from types import ModuleType

from harness.synth.archs import _parts as P
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec, arch_module
from harness.synth.tensors import EXPERT_BIAS_STD, ROUTER_BIAS_STD, SINK_STD, TensorPlan, _lin, _ones, _vec


def _gptoss_layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """Exactly the tensors llama.cpp's gpt-oss loader creates (an extra one is fatal), with the optional q/k/v
    biases the published files carry. No ffn_norm: post_attention_norm is the MoE input's norm."""
    d, dt, hd, e, ff = spec.n_embd, spec.dense_type, spec.head_dim, spec.n_expert, spec.n_ff_exp
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    p = f"blk.{il}."
    return [
        _ones(p + "attn_norm.weight", d, il),
        _lin(p + "attn_q.weight", d, n_q, dt, il),
        _vec(p + "attn_q.bias", (n_q,), 0.1, il),
        _lin(p + "attn_k.weight", d, n_kv, dt, il),
        _vec(p + "attn_k.bias", (n_kv,), 0.1, il),
        _lin(p + "attn_v.weight", d, n_kv, dt, il),
        _vec(p + "attn_v.bias", (n_kv,), 0.1, il),
        _lin(p + "attn_output.weight", n_q, d, dt, il),
        _vec(p + "attn_output.bias", (d,), 0.1, il),
        _vec(p + "attn_sinks.weight", (spec.n_head,), SINK_STD, il),
        _ones(p + "post_attention_norm.weight", d, il),
        P.router(spec, il),
        _vec(p + "ffn_gate_inp.bias", (e,), ROUTER_BIAS_STD, il),
        # resident beside the streamed experts: one expert's three bias rows are 4*(2*ff + d) bytes
        _vec(p + "ffn_gate_exps.bias", (ff, e), EXPERT_BIAS_STD, il),
        _vec(p + "ffn_up_exps.bias", (ff, e), EXPERT_BIAS_STD, il),
        _vec(p + "ffn_down_exps.bias", (d, e), EXPERT_BIAS_STD, il),
        *P._experts(spec, il, ff),
    ]


def _layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    if spec.arch == "gpt-oss":
        return _gptoss_layer(spec, il)
    p = f"blk.{il}."
    out = P.qkvo(spec, il, norm=True)
    if spec.arch in ("qwen3moe", "qwen3"):
        out += P.qk_norms(spec, il)
    elif spec.arch == "olmoe":  # q/k norms over the full width
        out += [_ones(p + "attn_q_norm.weight", spec.n_head * spec.head_dim, il),
                _ones(p + "attn_k_norm.weight", spec.n_head_kv * spec.head_dim, il)]
    out.append(_ones(p + "ffn_norm.weight", spec.n_embd, il))
    if spec.arch == "qwen3":
        return out + P.mlp(spec, il, spec.n_ff)
    return out + (P.gated_shared_moe(spec, il) if spec.arch == "qwen2moe" else P.routed(spec, il))


def tensors(spec: ModelSpec) -> list[TensorPlan]:
    return P.model_tensors(spec, _layer)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a, n_ff_exp = spec.arch, spec.n_ff_exp
    if a == "qwen3":
        own = [P.u32(f"{a}.feed_forward_length", spec.n_ff)]
    elif a == "olmoe":
        own = [P.u32(f"{a}.feed_forward_length", n_ff_exp)]
    elif a == "gpt-oss":  # as the published files: both lengths, and the window (the alternation is llama.cpp's)
        own = [P.u32(f"{a}.feed_forward_length", n_ff_exp), P.u32(f"{a}.expert_feed_forward_length", n_ff_exp),
               P.u32(f"{a}.attention.sliding_window", spec.n_swa)]
    else:
        own = [P.u32(f"{a}.expert_feed_forward_length", n_ff_exp)]
    out = P.after_model_keys(spec, base, own)
    if a == "qwen2moe":
        out = P.before_tokenizer(out, [P.u32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp)])
    return out


def layout(arch: str) -> ModuleType:
    """The module that lays out `arch`: its own under harness.synth.archs, else this one."""
    return arch_module(arch) or sys.modules[__name__]
