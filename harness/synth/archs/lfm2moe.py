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
    more_bits_type="",  # a K-quant _M mix: this type for ffn_down*/attn_v of llama.cpp's use_more_bits layers
    embd_type="",  # the token embedding's type ("" = the dense type)
)

# LFM2-8B-A1B and LFM2.5-8B-A1B (the same layers; LFM2.5's vocab is 128000): 24 layers, 2048 wide, 2 leading
# dense blocks of 7168, 32 experts of 1792, top-4; attention (32 heads, 8 KV heads of 64) in layers 2, 6, 10, 14,
# 18, 21, short convolutions of length 3 elsewhere; tied output head. Types as llama.cpp's Q5_K_M (the file the
# original streamed, LFM2.5-8B-A1B-Q5_K_M): Q5_K, Q6_K for the tied embedding and for every ffn_down* and attn_v
# of its use_more_bits layers; norms, routers, exp_probs_b and the convolution kernels f32.
_LFM2 = dict(
    n_layer=24, n_expert=32, n_expert_used=4, n_embd=2048, n_ff_exp=1792, n_ff=7168, n_head=32, n_head_kv=8,
    head_dim=64, ctx_len=128000, expert_type="q5_k", dense_type="q5_k", rms_eps=1e-5,
    arch_opts=(("n_dense_lead", 2), ("attn_layers", (2, 6, 10, 14, 18, 21)), ("l_cache", 3), ("tied_output", True),
               ("more_bits_type", "q6_k"), ("embd_type", "q6_k")),
)
SHAPES = {
    "lfm2-8b-a1b": {**_LFM2, "n_vocab": 65536, "rope_freq_base": 1_000_000.0},
    "lfm2.5-8b-a1b": {**_LFM2, "n_vocab": 128000, "rope_freq_base": 5_000_000.0},
}
SPEC_DEFAULTS: dict[str, Any] = dict(n_layer=6)
PROBS_BIAS_STD = 0.2


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
    o, d, dt = merge_opts(spec, OPTS), spec.n_embd, spec.dense_type
    out = [P.embedding(spec)]
    head = P.output(spec, norm="token_embd_norm.weight")
    out.append(head[0])
    if not o["tied_output"]:
        out.append(head[1])
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out.append(P._ones(p + "ffn_norm.weight", d, il))
        if il >= o["n_dense_lead"]:
            out += [*P.routed(spec, il), P.probs_bias(spec, il, PROBS_BIAS_STD)]
        else:
            out += P.mlp(spec, il, spec.n_ff)
        out.append(P._ones(p + "attn_norm.weight", d, il))
        if il in o["attn_layers"]:
            out += P.qk_norms(spec, il)
            out += P.qkvo(spec, il, d)
        else:
            out += [
                P.TensorPlan(p + "shortconv.conv.weight", (o["l_cache"], d), "f32", "normal",
                             1.0 / math.sqrt(o["l_cache"]), layer=il),
                P._lin(p + "shortconv.in_proj.weight", d, 3 * d, dt, il),
                P._lin(p + "shortconv.out_proj.weight", d, d, dt, il),
            ]
    return P.k_mix(out, o["more_bits_type"], o["embd_type"], spec.n_layer)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    o, a = merge_opts(spec, OPTS), ARCH
    kv_heads = [spec.n_head_kv if il in o["attn_layers"] else 0 for il in range(spec.n_layer)]
    return P.after_model_keys(spec, base, drop=(".attention.head_count_kv",), own=[
        P.u32_array(f"{a}.attention.head_count_kv", kv_heads),
        P.u32(f"{a}.feed_forward_length", spec.n_ff),
        P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.leading_dense_block_count", o["n_dense_lead"]),
        P.u32(f"{a}.shortconv.l_cache", o["l_cache"]),
        P.u32(f"{a}.expert_gating_func", P.GATING_SIGMOID),
    ])
