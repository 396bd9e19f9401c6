"""Named model shapes for `make-model --shape` (pure). Explicit flags override a shape's fields."""

from __future__ import annotations

import dataclasses

from harness.errors import UserError
from harness.synth.spec import ModelSpec

# Qwen3-30B-A3B's real layer count, experts, top-k, widths and heads; a small byte-level vocab instead of
# 151936 tokens; dense weights Q8_0 (the real Q4_K_M file keeps attention at 4-6 bits), experts Q4_K.
_QWEN3_30B = dict(
    n_layer=48,
    n_expert=128,
    n_expert_used=8,
    n_embd=2048,
    n_ff_exp=768,
    n_head=32,
    n_head_kv=4,
    head_dim=128,
    n_vocab=1024,
    ctx_len=40960,
    expert_type="q4_k",
    dense_type="q8_0",
)

SHAPES: dict[str, dict[str, object]] = {
    # the default test model (7 MB at Q4_K): writes in well under a second
    "tiny": {},
    # more experts and a wider top-k, still small (137 MB, f32 dense): cache and eviction tests
    "small": dict(
        n_layer=8,
        n_expert=32,
        n_expert_used=4,
        n_embd=512,
        n_ff_exp=512,
        n_head=8,
        n_head_kv=2,
        head_dim=64,
        n_vocab=512,
    ),
    # Qwen3-30B-A3B's per-layer shape with 16 of its 48 layers (5.8 GB): a benchmark that runs at a
    # few tokens per second on two cores
    "bench": {**_QWEN3_30B, "n_layer": 16},
    "qwen3-30b-a3b": _QWEN3_30B,
}


def shape_spec(name: str, **overrides: object) -> ModelSpec:
    """The spec of shape `name` with the non-None overrides applied."""
    if name not in SHAPES:
        raise UserError(f"--shape {name!r} is not one of {', '.join(SHAPES)}")
    fields = {**SHAPES[name], **{k: v for k, v in overrides.items() if v is not None}}
    return dataclasses.replace(ModelSpec(), **fields)
