"""What qwen35moe and qwen3next share (pure): gated-delta-net layers with a full-attention layer every
`full_attn_interval`, routed experts plus a sigmoid-gated shared expert in every layer, and nextn (MTP) blocks
after the trunk that block_count counts but the main graph never runs (the loader skips their tensors unless
asked to load the MTP head, yet they must be in the file)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import opts as merge_opts
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

TensorPlan = P.TensorPlan

# the tiny model's: head dim 32 for the linear attention, 2 key heads, 4 value heads, a full-attention layer
# every other layer (the real models: every 4th), one MTP block
OPTS: dict[str, Any] = dict(
    n_nextn=1,  # MTP blocks after the trunk (spec.n_layer counts the trunk only)
    full_attn_interval=2,
    ssm_d_state=32,  # key and value head size of the linear attention
    ssm_n_group=2,  # key heads
    ssm_dt_rank=4,  # value heads
    ssm_d_conv=4,
    rope_dim=16,  # rotated dims of a full-attention head (partial RoPE)
    more_bits_type="",  # a K-quant _M mix: this type for ffn_down*/attn_v of llama.cpp's use_more_bits layers
    embd_type="",  # the token embedding's type ("" = the dense type)
)
SPEC_DEFAULTS: dict[str, Any] = {}


def dims(spec: ModelSpec) -> dict[str, int]:
    o = merge_opts(spec, OPTS)
    key_dim = o["ssm_d_state"] * o["ssm_n_group"]
    value_dim = o["ssm_d_state"] * o["ssm_dt_rank"]
    return {**o, "key_dim": key_dim, "value_dim": value_dim, "conv_dim": 2 * key_dim + value_dim}


def is_recurrent(spec: ModelSpec, il: int) -> bool:
    return il < spec.n_layer and (il + 1) % dims(spec)["full_attn_interval"] != 0


def validate(spec: ModelSpec) -> None:
    o = dims(spec)
    for k in ("ssm_d_state", "ssm_n_group", "ssm_dt_rank", "ssm_d_conv", "full_attn_interval", "rope_dim"):
        if o[k] < 1:
            raise UserError(f"--arch {spec.arch}: {k} must be at least 1 (got {o[k]})")
    if o["ssm_dt_rank"] % o["ssm_n_group"]:
        raise UserError(f"--arch {spec.arch}: value heads ({o['ssm_dt_rank']}) must be a multiple of key heads "
                        f"({o['ssm_n_group']})")
    if o["rope_dim"] > spec.head_dim or o["rope_dim"] % 2:
        raise UserError(f"--arch {spec.arch}: rope_dim {o['rope_dim']} must be even and at most --head-dim")
    if spec.n_ff_shexp < 1:
        raise UserError(f"--shared-ff must be at least 1 (got {spec.n_ff_shexp})")


def attention(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """Full attention with a joint query+gate projection (2 x n_head x head_dim) and per-head q/k norms."""
    n_q = spec.n_head * spec.head_dim
    return [*P.qkvo(spec, il, 2 * n_q, n_o=n_q), *P.qk_norms(spec, il)]


def linear_common(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """The gated delta net's tensors both archs have (qwen35moe adds ssm_alpha/ssm_beta, qwen3next ssm_ba)."""
    o, d, dt, p = dims(spec), spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        P._lin(p + "attn_qkv.weight", d, o["conv_dim"], dt, il),
        P._lin(p + "attn_gate.weight", d, o["value_dim"], dt, il),
        P.TensorPlan(p + "ssm_conv1d.weight", (o["ssm_d_conv"], o["conv_dim"]), "f32", "normal",
                     1.0 / math.sqrt(o["ssm_d_conv"]), layer=il),
        P._vec(p + "ssm_dt.bias", (o["ssm_dt_rank"],), 0.5, il),
        # A = -exp(A_log) < 0, so that exp(softplus(.) * A) decays the state
        P.TensorPlan(p + "ssm_a", (o["ssm_dt_rank"],), "f32", "const", -0.5, layer=il),
        P._ones(p + "ssm_norm.weight", o["ssm_d_state"], il),
        P._lin(p + "ssm_out.weight", o["value_dim"], d, dt, il),
    ]


def tensors(spec: ModelSpec, linear: Callable[[ModelSpec, int], list[TensorPlan]]) -> list[TensorPlan]:
    """The whole file: every block (the trunk's, then the MTP ones) holds `linear(spec, il)` (the arch's gated delta
    net) in its recurrent layers and full attention in the others, then the experts."""
    d = spec.n_embd
    out = [P.embedding(spec)]
    for il in range(n_blocks(spec)):
        p = f"blk.{il}."
        out += [P._ones(p + "attn_norm.weight", d, il), P._ones(p + "post_attention_norm.weight", d, il)]
        out += linear(spec, il) if is_recurrent(spec, il) else attention(spec, il)
        out += P.gated_shared_moe(spec, il)
        if il >= spec.n_layer:
            out += P.nextn_block(spec, il)
    return mix(spec, out + P.output(spec))


def n_blocks(spec: ModelSpec) -> int:
    return spec.n_layer + dims(spec)["n_nextn"]


def mix(spec: ModelSpec, tensors: list[TensorPlan]) -> list[TensorPlan]:
    o = dims(spec)
    return P.k_mix(tensors, o["more_bits_type"], o["embd_type"], n_blocks(spec))


def kvs(spec: ModelSpec, base: list[KV], sections: bool) -> list[KV]:
    a, o = spec.arch, dims(spec)
    own = [
        P.u32(f"{a}.block_count", n_blocks(spec)),
        P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.expert_shared_feed_forward_length", spec.n_ff_shexp),
        P.u32(f"{a}.rope.dimension_count", o["rope_dim"]),
        P.u32(f"{a}.ssm.conv_kernel", o["ssm_d_conv"]),
        P.u32(f"{a}.ssm.inner_size", o["value_dim"]),
        P.u32(f"{a}.ssm.state_size", o["ssm_d_state"]),
        P.u32(f"{a}.ssm.time_step_rank", o["ssm_dt_rank"]),
        P.u32(f"{a}.ssm.group_count", o["ssm_n_group"]),
        P.u32(f"{a}.full_attention_interval", o["full_attn_interval"]),
    ]
    if sections:  # interleaved M-RoPE sections over the rotated half-dims (text: every section sees the position)
        r = o["rope_dim"] // 2
        s = 11 * r // 32
        own.append(KV(f"{a}.rope.dimension_sections", VT.ARRAY, [s, s, r - 2 * s, 0], VT.INT32))
    if o["n_nextn"]:
        own.append(P.u32(f"{a}.nextn_predict_layers", o["n_nextn"]))
    return P.after_model_keys(spec, base, own, drop=(".block_count",))

