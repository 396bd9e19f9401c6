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


def _linear(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    ba = P._lin(f"blk.{il}.ssm_ba.weight", spec.n_embd, 2 * G.dims(spec)["ssm_dt_rank"], spec.dense_type, il)
    return [*G.linear_common(spec, il), ba]


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return G.tensors(spec, _linear)


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    return G.kvs(spec, base, sections=False)
