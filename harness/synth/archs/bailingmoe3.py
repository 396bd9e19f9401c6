"""bailingmoe3 (Ling 3.0, e.g. Ling-3-7.9B-A1.3B): exactly the tensors llama.cpp's bailingmoe3 loader creates.

A hybrid: most layers are KDA linear attention (Kimi delta attention: q/k/v projections each through a short
causal convolution, a per-channel forget gate ssm_f_a + ssm_dt.bias scaled by ssm_a, a beta gate, a gated
output norm), the others gated MLA (low-rank KV with a decoupled RoPE part, attn_k_b/attn_v_b per head, a
sigmoid gate per head). Which is which is read from the per-layer head_count_kv array: 0 marks a KDA layer.
The first `dense_lead` layers have a dense SwiGLU FFN (n_ff), the rest routed experts (sigmoid gating with a
selection bias exp_probs_b) plus a shared expert (resident).

arch_params (defaults for tiny models): mla_every (every n-th layer is MLA), dense_lead, kda_head_dim, conv_kernel,
kv_lora_rank, qk_rope_dim, qk_nope_dim, v_head_dim, shared_experts.
"""

from __future__ import annotations

import math
from typing import Any

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "bailingmoe3"
SPEC_DEFAULTS: dict[str, Any] = {}
PARAMS: dict[str, int] = dict(mla_every=4, dense_lead=1, kda_head_dim=64, conv_kernel=4, kv_lora_rank=128,
                              qk_rope_dim=32, qk_nope_dim=64, v_head_dim=64, shared_experts=1)
GATING_SIGMOID = 2
KDA_GATE_LOWER_BOUND = -5.0


def _p(spec: ModelSpec, name: str) -> int:
    return param(spec, PARAMS, name)


def is_mla(spec: ModelSpec, il: int) -> bool:
    """The last of every mla_every layers is gated MLA, the others KDA."""
    return (il + 1) % _p(spec, "mla_every") == 0


def validate(spec: ModelSpec) -> None:
    if _p(spec, "dense_lead") >= spec.n_layer:
        raise UserError(f"bailingmoe3's dense_lead {_p(spec, 'dense_lead')} leaves no MoE layer in --layers "
                        f"{spec.n_layer}")


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a, u32, f32 = spec.arch, VT.UINT32, VT.FLOAT32
    lora, rope = _p(spec, "kv_lora_rank"), _p(spec, "qk_rope_dim")
    return P.override(base, [
        # 0 KV heads marks a KDA layer; MLA layers cache one compressed KV head
        KV(f"{a}.attention.head_count_kv", VT.ARRAY, [int(is_mla(spec, il)) for il in range(spec.n_layer)],
           VT.INT32),
        # the MLA cache: keys are the compressed KV plus the RoPE part, values the compressed KV
        KV(f"{a}.attention.key_length", u32, lora + rope),
        KV(f"{a}.attention.value_length", u32, lora),
        KV(f"{a}.attention.key_length_mla", u32, _p(spec, "qk_nope_dim") + rope),
        KV(f"{a}.attention.value_length_mla", u32, _p(spec, "v_head_dim")),
        KV(f"{a}.attention.kv_lora_rank", u32, lora),
        KV(f"{a}.rope.dimension_count", u32, rope),
        KV(f"{a}.ssm.conv_kernel", u32, _p(spec, "conv_kernel")),
        KV(f"{a}.kda.head_dim", u32, _p(spec, "kda_head_dim")),
        KV(f"{a}.kda.gate_lower_bound", f32, KDA_GATE_LOWER_BOUND),
        KV(f"{a}.feed_forward_length", u32, spec.n_ff),
        KV(f"{a}.expert_feed_forward_length", u32, spec.n_ff_exp),
        KV(f"{a}.expert_shared_count", u32, _p(spec, "shared_experts")),
        KV(f"{a}.leading_dense_block_count", u32, _p(spec, "dense_lead")),
        KV(f"{a}.expert_weights_scale", f32, 2.5),
        KV(f"{a}.expert_weights_norm", VT.BOOL, True),
        KV(f"{a}.expert_gating_func", u32, GATING_SIGMOID),
    ])


def _kda(spec: ModelSpec, p: str, il: int) -> list[P.TensorPlan]:
    d, dt, hd = spec.n_embd, spec.dense_type, _p(spec, "kda_head_dim")
    inner, kc = hd * spec.n_head, _p(spec, "conv_kernel")
    conv = [P.TensorPlan(p + f"ssm_conv1d_{x}.weight", (kc, 1, inner), "f32", "normal", 1.0 / math.sqrt(kc), layer=il)
            for x in "qkv"]
    return [
        *conv,
        P._lin(p + "attn_q.weight", d, inner, dt, il),
        P._lin(p + "attn_k.weight", d, inner, dt, il),
        P._lin(p + "attn_v.weight", d, inner, dt, il),
        P._lin(p + "ssm_f_a.weight", d, inner, dt, il),
        P._lin(p + "ssm_beta.weight", d, spec.n_head, dt, il),
        P.TensorPlan(p + "ssm_a", (1, spec.n_head), "f32", "one_plus", 0.25, layer=il),
        P._vec(p + "ssm_dt.bias", (inner,), 0.5, il),
        P._lin(p + "ssm_g_a.weight", d, inner, dt, il),
        P._ones(p + "ssm_norm.weight", hd, il),
        P._lin(p + "attn_output.weight", inner, d, dt, il),
    ]


def _mla(spec: ModelSpec, p: str, il: int) -> list[P.TensorPlan]:
    d, dt, nh = spec.n_embd, spec.dense_type, spec.n_head
    lora, rope, nope, vd = (_p(spec, k) for k in ("kv_lora_rank", "qk_rope_dim", "qk_nope_dim", "v_head_dim"))
    return [
        P._lin(p + "attn_q.weight", d, nh * (nope + rope), dt, il),
        P._lin(p + "attn_kv_a_mqa.weight", d, lora + rope, dt, il),
        P._ones(p + "attn_kv_a_norm.weight", lora, il),
        P.TensorPlan(p + "attn_k_b.weight", (nope, lora, nh), "f32", "normal", 1.0 / math.sqrt(nope), layer=il),
        P.TensorPlan(p + "attn_v_b.weight", (lora, vd, nh), "f32", "normal", 1.0 / math.sqrt(lora), layer=il),
        P._lin(p + "attn_gate.weight", d, nh, dt, il),
        P._lin(p + "attn_output.weight", nh * vd, d, dt, il),
    ]


def _layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    d, p = spec.n_embd, f"blk.{il}."
    out = [P._ones(p + "attn_norm.weight", d, il)]
    out += _mla(spec, p, il) if is_mla(spec, il) else _kda(spec, p, il)
    out.append(P._ones(p + "ffn_norm.weight", d, il))
    if il < _p(spec, "dense_lead"):
        return out + P.mlp(spec, il, spec.n_ff)
    ff_sh = spec.n_ff_exp * _p(spec, "shared_experts")
    return out + [
        P.router(spec, il),
        P.probs_bias(spec, il, 0.1),
        *P._experts(spec, il, spec.n_ff_exp),
        *P.mlp(spec, il, ff_sh, "_shexp"),
    ]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    out = [P.embedding(spec), *P.output(spec)]
    for il in range(spec.n_layer):
        out += _layer(spec, il)
    return out
