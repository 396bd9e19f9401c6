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

# Qwen3.6-35B-A3B (the published config): 40 layers, 3 gated-delta-net layers then one full-attention layer, 2048
# wide; linear attention 16 key heads and 32 value heads of 128; attention 16 query heads, 2 KV heads of 256, 64
# rotated dims; 256 experts of 512, top-8, one shared expert of 512; one MTP block; the real 248320-token vocab
# (embedding and head are 1.1 GB at Q8_0). The type mix follows llama.cpp's Q4_K_M where it moves the size:
# Q4_K experts, Q6_K for every ffn_down* and attn_v of its use_more_bits layers; the other dense weights Q8_0
# (the published file keeps them at 4-6 bits: a little smaller).
SHAPES = {
    "qwen3.6-35b-a3b": dict(
        n_layer=40, n_expert=256, n_expert_used=8, n_embd=2048, n_ff_exp=512, n_ff_shexp=512, n_head=16,
        n_head_kv=2, head_dim=256, n_vocab=248320, ctx_len=262144, expert_type="q4_k", dense_type="q8_0",
        rope_freq_base=10_000_000.0,
        arch_opts=(("n_nextn", 1), ("full_attn_interval", 4), ("ssm_d_state", 128), ("ssm_n_group", 16),
                   ("ssm_dt_rank", 32), ("ssm_d_conv", 4), ("rope_dim", 64), ("more_bits_type", "q6_k")),
    ),
}


def _linear(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    o, d, dt, p = G.dims(spec), spec.n_embd, spec.dense_type, f"blk.{il}."
    return [
        *G.linear_common(spec, il),
        P._lin(p + "ssm_beta.weight", d, o["ssm_dt_rank"], dt, il),
        P._lin(p + "ssm_alpha.weight", d, o["ssm_dt_rank"], dt, il),
    ]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return G.tensors(spec, _linear)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    return G.kvs(spec, base, sections=True)
