"""lfm2moe (LFM2-8B-A1B): short-convolution blocks with a few attention blocks, leading dense FFN blocks, then
sigmoid-gated routed experts with exp_probs_b (llama.cpp's lfm2moe loader, exactly). A layer is recurrent (a
short convolution) where its head_count_kv is 0; the output norm is named token_embd_norm."""

from __future__ import annotations

import math
from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import opts as merge_opts
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "lfm2moe"
# the tiny model: 6 layers, 2 leading dense blocks, attention in layers 2 and 5, convolutions elsewhere
OPTS: dict[str, Any] = dict(
    n_dense_lead=2,
    attn_layers=(2, 5),
    l_cache=3,  # short convolution length
    tied_output=False,  # no output.weight: the head is the token embedding (the published files)
)
SPEC_DEFAULTS: dict[str, Any] = dict(n_layer=6)
GATING_SIGMOID = 2


def validate(spec: ModelSpec) -> None:
    o = merge_opts(spec, OPTS)
    if spec.n_head * spec.head_dim != spec.n_embd:
        raise UserError(f"--arch lfm2moe needs --heads x --head-dim == --embd ({spec.n_head} x {spec.head_dim} != "
                        f"{spec.n_embd})")
    if not 0 <= o["n_dense_lead"] < spec.n_layer:
        raise UserError(f"--arch lfm2moe: {o['n_dense_lead']} leading dense blocks leave no MoE layer of "
                        f"{spec.n_layer}")
    if any(not 0 <= il < spec.n_layer for il in o["attn_layers"]):
        raise UserError(f"--arch lfm2moe: attention layers {o['attn_layers']} outside 0..{spec.n_layer - 1}")
    if o["l_cache"] < 2:
        raise UserError(f"--arch lfm2moe: the short convolution needs l_cache >= 2 (got {o['l_cache']})")


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    o, d, dt, hd = merge_opts(spec, OPTS), spec.n_embd, spec.dense_type, spec.head_dim
    out = [P.embedding(spec)]
    head = P.output(spec, norm="token_embd_norm.weight")
    out.append(head[0])
    if not o["tied_output"]:
        out.append(head[1])
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out.append(P._ones(p + "ffn_norm.weight", d, il))
        if il >= o["n_dense_lead"]:
            out += [*P.routed(spec, il), P.probs_bias(spec, il)]
        else:
            out += P.mlp(spec, il, spec.n_ff)
        out.append(P._ones(p + "attn_norm.weight", d, il))
        if il in o["attn_layers"]:
            out += [P._ones(p + "attn_q_norm.weight", hd, il), P._ones(p + "attn_k_norm.weight", hd, il)]
            out += P.qkvo(spec, il, d, spec.n_head_kv * hd)
        else:
            out += [
                P.TensorPlan(p + "shortconv.conv.weight", (o["l_cache"], d), "f32", "normal",
                             1.0 / math.sqrt(o["l_cache"]), layer=il),
                P._lin(p + "shortconv.in_proj.weight", d, 3 * d, dt, il),
                P._lin(p + "shortconv.out_proj.weight", d, d, dt, il),
            ]
    return out


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    o, a = merge_opts(spec, OPTS), ARCH
    kv_heads = [spec.n_head_kv if il in o["attn_layers"] else 0 for il in range(spec.n_layer)]
    return P.without(base, ".attention.head_count_kv") + [
        P.u32_array(f"{a}.attention.head_count_kv", kv_heads),
        P.u32(f"{a}.feed_forward_length", spec.n_ff),
        P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.leading_dense_block_count", o["n_dense_lead"]),
        P.u32(f"{a}.shortconv.l_cache", o["l_cache"]),
        P.u32(f"{a}.expert_gating_func", GATING_SIGMOID),
    ]
