"""qwen35moe (Qwen3.5/3.6 MoE, e.g. Qwen3.6-35B-A3B): gated delta net + full attention, routed and shared
experts in every layer, an MTP block after the trunk (llama.cpp's qwen35moe loader, exactly)."""

from __future__ import annotations

from harness.synth.archs import _deltanet as G
from harness.synth.archs import _parts as P
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "qwen35moe"
OPTS = G.OPTS
SPEC_DEFAULTS = G.SPEC_DEFAULTS
validate = G.validate


def _linear(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    o, d, dt, p = G.dims(spec), spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        *G.linear_common(spec, il),
        P._lin(p + "ssm_beta.weight", d, o["ssm_dt_rank"], dt, il),
        P._lin(p + "ssm_alpha.weight", d, o["ssm_dt_rank"], dt, il),
    ]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d = spec.n_embd
    out = [P.embedding(spec)]
    for il in range(G.n_blocks(spec)):
        p = f"blk.{il}."
        out += [P._ones(p + "attn_norm.weight", d, il), P._ones(p + "post_attention_norm.weight", d, il)]
        out += _linear(spec, il) if G.is_recurrent(spec, il) else G.attention(spec, il)
        out += G.moe(spec, il)
        if il >= spec.n_layer:
            out += G.nextn(spec, il)
    return out + P.output(spec)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    return G.kvs(spec, base, sections=True)
