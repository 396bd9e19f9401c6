"""qwen3next (Qwen3-Next-80B-A3B): gated delta net (fused beta/alpha projection) + full attention, routed and
shared experts in every layer, an MTP block after the trunk (llama.cpp's qwen3next loader, exactly)."""

from __future__ import annotations

from harness.synth.archs import _deltanet as G
from harness.synth.archs import _parts as P
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "qwen3next"
OPTS = G.OPTS
SPEC_DEFAULTS = G.SPEC_DEFAULTS
validate = G.validate


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d, dt = spec.n_embd, spec.dense_type
    out = [P.embedding(spec)]
    for il in range(G.n_blocks(spec)):
        p = f"blk.{il}."
        out += [P._ones(p + "attn_norm.weight", d, il), P._ones(p + "post_attention_norm.weight", d, il)]
        if G.is_recurrent(spec, il):
            out += [*G.linear_common(spec, il), P._lin(p + "ssm_ba.weight", d, 2 * G.dims(spec)["ssm_dt_rank"], dt, il)]
        else:
            out += G.attention(spec, il)
        out += G.moe(spec, il)
        if il >= spec.n_layer:
            out += P.nextn_block(spec, il)
    return G.mix(spec, out + P.output(spec))


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    return G.kvs(spec, base, sections=False)
