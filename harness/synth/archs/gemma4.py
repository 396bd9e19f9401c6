"""gemma4 (Gemma 4 MoE, e.g. gemma-4-26B-A4B): exactly the tensors llama.cpp's gemma4 loader creates.

Every layer holds a dense GELU MLP (ffn_gate/up/down, n_ff wide) beside the routed experts; the experts' gate and
up are one fused tensor ffn_gate_up_exps {n_embd, 2*n_ff_exp, n_expert}, and ffn_down_exps has a per-expert
`.scale` {n_expert}. The router is computed outside the shared MoE builder: rms_norm(attn_out) / sqrt(n_embd) *
ffn_gate_inp.scale, times ffn_gate_inp. Sliding-window layers alternate with full-attention ones (the
`sliding_window_pattern` array); the full ones read one shared `rope_freqs`. The output head is tied to the
embeddings (no output.weight), as in the published files; no per-layer embeddings (the E2B/E4B feature).
"""

from __future__ import annotations

import math
from typing import Any

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.gguf_encode import KV
from harness.synth.spec import BLOCK_ELEMS, ModelSpec

ARCH = "gemma4"
SPEC_DEFAULTS: dict[str, Any] = {}
# Gemma-4-26B-A4B, from the published GGUF's metadata (bartowski's google_gemma-4-26B-A4B-it-Q4_K_M.gguf: 30 layers,
# 2816 wide, 128 experts top-8 of 704, a 2112-wide dense MLP, 16 query heads; sliding layers 8 KV heads of 256,
# every 6th layer full attention with 2 KV heads of 512 and no attn_v; a 1024-token window; 262144-token vocab, tied
# head). Types as that Q4_K_M file's bulk: gate_up Q4_K; down (704-wide rows, no multiple of 256) falls back to Q5_0
# as llama.cpp's quantiser does; dense weights Q8_0.
SHAPES = {
    "gemma-4-26b-a4b": dict(
        n_layer=30, n_expert=128, n_expert_used=8, n_embd=2816, n_ff_exp=704, n_ff=2112, n_head=16, n_head_kv=8,
        head_dim=256, n_vocab=262144, ctx_len=262144, n_swa=1024, expert_type="q4_k", expert_down_type="q5_0",
        dense_type="q8_0", arch_params=(("swa_period", 6), ("head_dim_full", 512), ("n_head_kv_full", 2)),
    ),
}

# arch_params: swa_period (every n-th layer is full attention; default 4, the 26B has 5 sliding : 1 full, so 6),
# head_dim_full and n_head_kv_full (the full-attention layers' head size and KV heads; default those of the rest)
SWA_PERIOD = 4
SOFTCAP = 30.0
DOWN_SCALE_STD = 0.25  # the per-expert down scales spread around 1, so a wrong expert's scale shows
# tied head: with the input embedding as strong as the layers' outputs, the logits of a random model favour the
# current token (e.e = 1 against e.e' ~ 1/sqrt(d)) and greedy decoding repeats it; a weak embedding lets the layers
# decide
EMBD_STD = 0.1


def swa_pattern(spec: ModelSpec) -> list[bool]:
    """True for a sliding-window layer; the last of every swa_period layers (and the last layer) is full attention."""
    every = spec.param("swa_period", SWA_PERIOD)
    return [not ((il + 1) % every == 0 or il == spec.n_layer - 1) for il in range(spec.n_layer)]


def validate(spec: ModelSpec) -> None:
    blk = BLOCK_ELEMS[spec.dense_type]
    for flag, width in (("--dense-ff", spec.n_ff), ("--embd", spec.n_embd)):
        if width % blk:
            raise UserError(f"{flag} {width} is not a multiple of {blk}, which --dense-type {spec.dense_type} needs")


def _full(spec: ModelSpec) -> tuple[int, int]:
    """(head size, KV heads) of the full-attention layers."""
    return spec.param("head_dim_full", spec.head_dim), spec.param("n_head_kv_full", spec.n_head_kv)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a, u32, f32 = spec.arch, VT.UINT32, VT.FLOAT32
    hd_full, kv_full = _full(spec)
    pattern = swa_pattern(spec)
    out = [
        KV(f"{a}.feed_forward_length", u32, spec.n_ff),
        KV(f"{a}.expert_feed_forward_length", u32, spec.n_ff_exp),
        # key_length is the full-attention layers' head size, key_length_swa the sliding ones'
        KV(f"{a}.attention.key_length", u32, hd_full),
        KV(f"{a}.attention.value_length", u32, hd_full),
        KV(f"{a}.attention.key_length_swa", u32, spec.head_dim),
        KV(f"{a}.attention.value_length_swa", u32, spec.head_dim),
        KV(f"{a}.rope.dimension_count", u32, hd_full),
        KV(f"{a}.rope.dimension_count_swa", u32, spec.head_dim),
        KV(f"{a}.attention.sliding_window", u32, spec.n_swa),
        KV(f"{a}.attention.sliding_window_pattern", VT.ARRAY, pattern, VT.BOOL),
        KV(f"{a}.attention.shared_kv_layers", u32, 0),
        KV(f"{a}.rope.freq_base_swa", f32, 10000.0),
        KV(f"{a}.embedding_length_per_layer_input", u32, 0),
        KV(f"{a}.final_logit_softcapping", f32, SOFTCAP),
    ]
    if kv_full != spec.n_head_kv:  # as the published 26B: a per-layer array
        heads = [spec.n_head_kv if swa else kv_full for swa in pattern]
        out.append(KV(f"{a}.attention.head_count_kv", VT.ARRAY, heads, VT.INT32))
    return P.override(base, out)


def _layer(spec: ModelSpec, il: int, swa: bool) -> list[P.TensorPlan]:
    d, dt, e, fe = spec.n_embd, spec.dense_type, spec.n_expert, spec.n_ff_exp
    hd, n_head_kv = (spec.head_dim, spec.n_head_kv) if swa else _full(spec)
    n_q, n_kv = spec.n_head * hd, n_head_kv * hd
    et = spec.expert_type
    init = "normal" if et == "f32" else "blocks"
    p = f"blk.{il}."
    # full-attention layers have no attn_v (V = K, the loader's "alternative attention"), as the published files
    attn_v = [P._lin(p + "attn_v.weight", d, n_kv, dt, il)] if swa else []
    return [
        P._ones(p + "attn_norm.weight", d, il),
        P._lin(p + "attn_q.weight", d, n_q, dt, il),
        P._lin(p + "attn_k.weight", d, n_kv, dt, il),
        *attn_v,
        P._lin(p + "attn_output.weight", n_q, d, dt, il),
        P._ones(p + "attn_q_norm.weight", hd, il),
        P._ones(p + "attn_k_norm.weight", hd, il),
        P._ones(p + "post_attention_norm.weight", d, il),
        P._ones(p + "layer_output_scale.weight", 1, il),
        # the dense MLP beside the experts (resident)
        P._ones(p + "ffn_norm.weight", d, il),
        *P.mlp(spec, il, spec.n_ff),
        P._ones(p + "post_ffw_norm.weight", d, il),
        # the router (its input is rms_norm(attn_out) / sqrt(n_embd) * scale: the weight carries the sqrt back)
        P.TensorPlan(p + "ffn_gate_inp.weight", (d, e), "f32", "normal", P.ROUTER_GAIN, layer=il),
        P._ones(p + "ffn_gate_inp.scale", d, il),
        P._ones(p + "pre_ffw_norm_2.weight", d, il),
        P._ones(p + "post_ffw_norm_1.weight", d, il),
        P._ones(p + "post_ffw_norm_2.weight", d, il),
        P.TensorPlan(p + "ffn_gate_up_exps.weight", (d, 2 * fe, e), et, init, P.EXPERT_GAIN / math.sqrt(d), (), il,
                   "gate_up"),
        P.TensorPlan(p + "ffn_down_exps.weight", (fe, d, e), spec.down_type,
                   "normal" if spec.down_type == "f32" else "blocks", P.DOWN_GAIN / math.sqrt(fe), (), il, "down"),
        P.TensorPlan(p + "ffn_down_exps.scale", (e,), "f32", "one_plus", DOWN_SCALE_STD, layer=il),
    ]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d = spec.n_embd
    # tied head: the control tokens' embedding rows are zero, so they never win greedy decoding
    # the graph scales the embeddings by sqrt(n_embd): the residual stream starts at RMS EMBD_STD
    out = [P.TensorPlan("token_embd.weight", (d, spec.n_vocab), spec.dense_type, "normal", EMBD_STD / math.sqrt(d),
                      P.control_ids(spec))]
    pattern = swa_pattern(spec)
    if not all(pattern):  # one rope_freqs for every full-attention layer (the loader's TENSOR_DUPLICATED)
        out.append(P._ones("rope_freqs.weight", _full(spec)[0] // 2, -1))
    for il in range(spec.n_layer):
        out += _layer(spec, il, pattern[il])
    out.append(P._ones("output_norm.weight", d, -1))
    return out
