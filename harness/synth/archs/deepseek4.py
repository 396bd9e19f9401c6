"""deepseek4 (DeepSeek V4, e.g. V4 Flash): exactly the tensors llama.cpp's deepseek4 loader creates.

What matters to streaming: the first `hash_layers` layers route by token id (ffn_gate_tid2eid, an I32 table
{n_expert_used, n_vocab}: the graph's ffn_moe_topk is then a GET_ROWS of it, not an argsort), the others by a
sqrt-softplus router with a selection bias (exp_probs_b); every layer has one always-on shared expert beside the
routed ones (resident). The rest is dense-side: hyper-connections (4 copies of the residual stream mixed by
Sinkhorn-normalised weights, hc_*), low-rank query and output projections with attention sinks, and compressed
attention on layers whose compress ratio is 4 (CSA, with the lightning indexer) or 128 (HCA).

arch_params (defaults for tiny models): q_lora_rank, o_lora_rank, o_groups, rope_dim, indexer_heads,
indexer_head_dim, indexer_top_k, hash_layers, shared_experts.
"""

from __future__ import annotations

from typing import Any

from gguf.constants import GGUFValueType as VT

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "deepseek4"
SPEC_DEFAULTS: dict[str, Any] = {}
# DeepSeek-V4-Flash (284B total, 13B active), for --dry-run sizing only (~91 GB does not fit this disk): 43 layers,
# 4096 wide, 256 experts top-6 of 2048 plus one shared, 64 heads of 512 (RoPE on 64), q and o low-rank 1024 with 8
# output groups, a 64-head indexer of 128, 3 hash-routed layers, a 128-token window, 129280-token vocab. Compared
# with unsloth's DeepSeek-V4-Flash-0731-UD-IQ2_M (3 shards, 90,926,928,288 bytes): routed experts IQ2_S (the IQ2_M
# scheme's bulk type, 2.56 bits per weight), dense weights Q4_K.
SHAPES = {
    "deepseek-v4-flash": dict(
        n_layer=43, n_expert=256, n_expert_used=6, n_embd=4096, n_ff_exp=2048, n_head=64, n_head_kv=1, head_dim=512,
        n_vocab=129280, ctx_len=1048576, n_swa=128, expert_type="iq2_s", dense_type="q4_k",
        arch_params=(("q_lora_rank", 1024), ("o_lora_rank", 1024), ("o_groups", 8), ("rope_dim", 64),
                     ("indexer_heads", 64), ("indexer_head_dim", 128), ("indexer_top_k", 512), ("hash_layers", 3),
                     ("shared_experts", 1)),
    ),
}
PARAMS: dict[str, int] = dict(q_lora_rank=128, o_lora_rank=64, o_groups=2, rope_dim=16, indexer_heads=2,
                              indexer_head_dim=64, indexer_top_k=16, hash_layers=2, shared_experts=1)
HC = 4  # hyper-connection copies: llama.cpp's graph asserts 4
# the lightning indexer's KV cache rotates keys by a Hadamard matrix of at least 64: its head size is a multiple of 64
HC_MIX = (2 + HC) * HC
GATING_SQRT_SOFTPLUS = 4
SWIGLU_LIMIT = 10.0
# compress ratio per layer: 0 (plain sliding-window attention), 4 (CSA + indexer) or 128 (HCA), cycling from
# layer 0, so a 4-layer model has one of each and a second CSA layer
RATIO_CYCLE = (0, 4, 128, 4)


def _p(spec: ModelSpec, name: str) -> int:
    return param(spec, PARAMS, name)


def compress_ratios(spec: ModelSpec) -> list[int]:
    return [RATIO_CYCLE[il % len(RATIO_CYCLE)] for il in range(spec.n_layer)]


def validate(spec: ModelSpec) -> None:
    if spec.n_head % _p(spec, "o_groups"):
        raise UserError(f"--heads {spec.n_head} is not a multiple of deepseek4's o_groups {_p(spec, 'o_groups')}")
    if _p(spec, "rope_dim") > min(spec.head_dim, _p(spec, "indexer_head_dim")):
        raise UserError(f"deepseek4's rope_dim {_p(spec, 'rope_dim')} exceeds --head-dim or the indexer head size")
    if _p(spec, "hash_layers") > spec.n_layer:
        raise UserError(f"deepseek4's hash_layers {_p(spec, 'hash_layers')} exceeds --layers {spec.n_layer}")


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a, u32, f32 = spec.arch, VT.UINT32, VT.FLOAT32
    return P.override(base, [
        KV(f"{a}.attention.head_count_kv", u32, 1),  # one shared KV head (wkv is {n_embd, head size})
        KV(f"{a}.rope.dimension_count", u32, _p(spec, "rope_dim")),
        KV(f"{a}.attention.q_lora_rank", u32, _p(spec, "q_lora_rank")),
        KV(f"{a}.attention.sliding_window", u32, spec.n_swa),
        KV(f"{a}.expert_feed_forward_length", u32, spec.n_ff_exp),
        KV(f"{a}.expert_shared_count", u32, _p(spec, "shared_experts")),
        KV(f"{a}.expert_weights_scale", f32, 1.5),
        KV(f"{a}.expert_weights_norm", VT.BOOL, True),
        KV(f"{a}.expert_gating_func", u32, GATING_SQRT_SOFTPLUS),
        KV(f"{a}.swiglu_clamp_exp", VT.ARRAY, [SWIGLU_LIMIT] * spec.n_layer, f32),
        KV(f"{a}.swiglu_clamp_shexp", VT.ARRAY, [SWIGLU_LIMIT] * spec.n_layer, f32),
        KV(f"{a}.attention.indexer.head_count", u32, _p(spec, "indexer_heads")),
        KV(f"{a}.attention.indexer.key_length", u32, _p(spec, "indexer_head_dim")),
        KV(f"{a}.attention.indexer.top_k", u32, _p(spec, "indexer_top_k")),
        KV(f"{a}.attention.output_group_count", u32, _p(spec, "o_groups")),
        KV(f"{a}.attention.output_lora_rank", u32, _p(spec, "o_lora_rank")),
        KV(f"{a}.attention.compress_rope_freq_base", f32, 160000.0),
        KV(f"{a}.attention.compress_ratios", VT.ARRAY, compress_ratios(spec), u32),
        KV(f"{a}.hyper_connection.count", u32, HC),
        KV(f"{a}.hyper_connection.sinkhorn_iterations", u32, 20),
        KV(f"{a}.hyper_connection.epsilon", f32, 1e-6),
        KV(f"{a}.hash_layer_count", u32, _p(spec, "hash_layers")),
        KV(f"{a}.embedding_length_out", u32, spec.n_embd * HC),
    ])


def _layer(spec: ModelSpec, il: int, ratio: int) -> list[P.TensorPlan]:
    d, dt, hd, e = spec.n_embd, spec.dense_type, spec.head_dim, spec.n_expert
    ql, ol, og = _p(spec, "q_lora_rank"), _p(spec, "o_lora_rank"), _p(spec, "o_groups")
    ih, ihd = _p(spec, "indexer_heads"), _p(spec, "indexer_head_dim")
    ff_sh = spec.n_ff_exp * _p(spec, "shared_experts")
    hc_dim = HC * d
    p = f"blk.{il}."
    out = [
        P._ones(p + "attn_norm.weight", d, il),
        P._vec(p + "attn_sinks.weight", (spec.n_head,), P.SINK_STD, il),
        P._lin(p + "attn_q_a.weight", d, ql, dt, il),
        P._ones(p + "attn_q_a_norm.weight", ql, il),
        P._lin(p + "attn_q_b.weight", ql, spec.n_head * hd, dt, il),
        P._lin(p + "attn_kv.weight", d, hd, dt, il),
        P._ones(p + "attn_kv_a_norm.weight", hd, il),
        # as the file holds it: {n_head*hd/o_groups, o_lora*o_groups} (the loader reshapes it to 3-D)
        P._lin(p + "attn_output_a.weight", spec.n_head * hd // og, ol * og, dt, il),
        P._lin(p + "attn_output_b.weight", og * ol, d, dt, il),
        P._lin(p + "hc_attn_fn.weight", hc_dim, HC_MIX, "f32", il),
        P._vec(p + "hc_attn_base.weight", (HC_MIX,), 0.1, il),
        P._ones(p + "hc_attn_scale.weight", 3, il),
        P._lin(p + "hc_ffn_fn.weight", hc_dim, HC_MIX, "f32", il),
        P._vec(p + "hc_ffn_base.weight", (HC_MIX,), 0.1, il),
        P._ones(p + "hc_ffn_scale.weight", 3, il),
    ]
    if ratio:
        coff = 2 if ratio == 4 else 1
        out += [
            P._lin(p + "attn_compressor_kv.weight", d, coff * hd, dt, il),
            P._lin(p + "attn_compressor_gate.weight", d, coff * hd, dt, il),
            P._vec(p + "attn_compressor_ape.weight", (coff * hd, ratio), 0.1, il),
            P._ones(p + "attn_compressor_norm.weight", hd, il),
        ]
        if ratio == 4:
            out += [
                P._lin(p + "indexer.proj.weight", d, ih, dt, il),
                P._lin(p + "indexer.attn_q_b.weight", ql, ih * ihd, dt, il),
                P._lin(p + "indexer_compressor_kv.weight", d, 2 * ihd, dt, il),
                P._lin(p + "indexer_compressor_gate.weight", d, 2 * ihd, dt, il),
                P._vec(p + "indexer_compressor_ape.weight", (2 * ihd, ratio), 0.1, il),
                P._ones(p + "indexer_compressor_norm.weight", ihd, il),
            ]
    out.append(P.router(spec, il))
    if il < _p(spec, "hash_layers"):  # token id -> its k experts
        out.append(P.TensorPlan(p + "ffn_gate_tid2eid.weight", (spec.n_expert_used, spec.n_vocab), "i32",
                              "expert_ids", float(e), layer=il))
    else:
        out.append(P.probs_bias(spec, il, 0.1))
    out.append(P._ones(p + "ffn_norm.weight", d, il))
    out += P._experts(spec, il, spec.n_ff_exp)
    out += [
        P._lin(p + "ffn_gate_shexp.weight", d, ff_sh, dt, il, P.EXPERT_GAIN),
        P._lin(p + "ffn_down_shexp.weight", ff_sh, d, dt, il, P.DOWN_GAIN),
        P._lin(p + "ffn_up_shexp.weight", d, ff_sh, dt, il, P.EXPERT_GAIN),
    ]
    return out


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d = spec.n_embd
    out = [
        P.embedding(spec),
        *P.output(spec),
        P._lin("output_hc_fn.weight", HC * d, HC, "f32", -1),
        P._vec("output_hc_base.weight", (HC,), 0.1, -1),
        P._ones("output_hc_scale.weight", 1, -1),
    ]
    for il, ratio in enumerate(compress_ratios(spec)):
        out += _layer(spec, il, ratio)
    return out
