"""Named model shapes for `make-model --shape` (pure). Explicit flags override a shape's fields."""

from __future__ import annotations

import dataclasses

from harness.errors import UserError
from harness.synth import archs
from harness.synth.spec import ModelSpec, arch_module

# Qwen3-30B-A3B's real layer count, experts, top-k, widths and heads; a small byte-level vocab instead of
# 151936 tokens; dense weights Q8_0 (the real Q4_K_M file keeps attention at 4-6 bits), experts Q4_K.
_QWEN3_30B = dict(n_layer=48, n_expert=128, n_expert_used=8, n_embd=2048, n_ff_exp=768, n_head=32, n_head_kv=4,
                  head_dim=128, n_vocab=1024, ctx_len=40960, expert_type="q4_k", dense_type="q8_0")

# gpt-oss (llama.cpp arch "gpt-oss"), from the published configs: 2880 wide (experts too), 64 query heads of 64,
# 8 KV heads, a 128-token sliding window on every other layer, RoPE base 150000 with YaRN x32 over 4096, top-4.
# Sizes are matched to ggml-org's MXFP4 GGUFs (20b 11.27 GiB, 120b 59.02 GiB of tensor data): MXFP4 experts, every
# 2-D dense weight Q8_0 (embeddings, attention, output head), router, biases, sinks and norms f32. The
# vocabulary keeps the real size (201088, byte-level pieces here), because the embedding and output head are
# 1.23 GB at Q8_0: with a 1024-token vocab the 20b file would be 10% short of the published one (120b: 2%), and
# the output head is part of the dense bytes read every token.
_GPT_OSS = dict(arch="gpt-oss", n_expert_used=4, n_embd=2880, n_ff_exp=2880, n_head=64, n_head_kv=8, head_dim=64,
                n_vocab=201088, ctx_len=131072, expert_type="mxfp4", dense_type="q8_0", n_swa=128)

# per-arch defaults, under a shape's own fields and explicit flags: gpt-oss's experts are MXFP4 and its RoPE is
# YaRN-scaled, whatever the size
ARCH_DEFAULTS: dict[str, dict[str, object]] = {
    "olmoe": dict(n_head_kv=4),  # k/v over every head (its k-norm spans n_embd)
    "gpt-oss": dict(expert_type="mxfp4", rms_eps=1e-5, rope_freq_base=150000.0, rope_yarn_factor=32.0,
                    rope_yarn_orig_ctx=4096),
}

SHAPES: dict[str, dict[str, object]] = {
    # the default test model (7 MB at Q4_K): writes in well under a second
    "tiny": {},
    # more experts and a wider top-k, still small (137 MB, f32 dense): cache and eviction tests
    "small": dict(n_layer=8, n_expert=32, n_expert_used=4, n_embd=512, n_ff_exp=512, n_head=8, n_head_kv=2, head_dim=64,
                  n_vocab=512),
    # Qwen3-30B-A3B's per-layer shape with 16 of its 48 layers (5.8 GB): a benchmark that runs at a
    # few tokens per second on two cores
    "bench": {**_QWEN3_30B, "n_layer": 16},
    "qwen3-30b-a3b": _QWEN3_30B,
    "gpt-oss-20b": {**_GPT_OSS, "n_layer": 24, "n_expert": 32},
    "gpt-oss-120b": {**_GPT_OSS, "n_layer": 36, "n_expert": 128},
}


# the real shapes of archs laid out by their own modules (harness.synth.archs), e.g. gemma-4-26b-a4b
SHAPES.update({k: v for k, v in archs.shapes().items() if k not in SHAPES})


def shape_spec(name: str, **overrides: object) -> ModelSpec:
    """The spec of shape `name` with the non-None overrides applied, over the arch's defaults."""
    if name not in SHAPES:
        raise UserError(f"--shape {name!r} is not one of {', '.join(SHAPES)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    shape = SHAPES[name]
    arch = str(given.get("arch", shape.get("arch", ModelSpec.arch)))
    mod = arch_module(arch)
    arch_defaults = ARCH_DEFAULTS.get(arch, getattr(mod, "SPEC_DEFAULTS", {}) if mod is not None else {})
    fields = {**arch_defaults, **shape, **given}
    return dataclasses.replace(ModelSpec(), **fields)
