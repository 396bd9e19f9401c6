"""llama4 (Llama 4 Scout/Maverick): routed experts plus a shared expert of the same width in every
`moe_step`-th layer, a dense FFN in the others; top-k with sigmoid weights (llama.cpp's llama4 loader,
exactly; no rope_freqs, which is optional)."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import opts as merge_opts
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec

ARCH = "llama4"
# the tiny model alternates dense and MoE layers as Maverick does (Scout: every layer, step 1)
OPTS: dict[str, Any] = dict(moe_step=2)
SPEC_DEFAULTS: dict[str, Any] = {}


def is_moe_layer(spec: ModelSpec, il: int) -> bool:
    return (il + 1) % merge_opts(spec, OPTS)["moe_step"] == 0


def validate(spec: ModelSpec) -> None:
    step = merge_opts(spec, OPTS)["moe_step"]
    if not 1 <= step <= spec.n_layer:
        raise UserError(f"--arch llama4: moe_step {step} must be between 1 and --layers ({spec.n_layer})")


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    d = spec.n_embd
    out = [P.embedding(spec), *P.output(spec)]
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out += [*P.qkvo(spec, il, norm=True),
                P._ones(p + "ffn_norm.weight", d, il)]
        if is_moe_layer(spec, il):
            out += [*P.routed(spec, il), *P.mlp(spec, il, spec.n_ff_exp, "_shexp")]
        else:
            out += P.mlp(spec, il, spec.n_ff)
    return out


def kvs(spec: ModelSpec, base: list[KV]) -> list[KV]:
    a = ARCH
    return P.after_model_keys(spec, base, [
        P.u32(f"{a}.feed_forward_length", spec.n_ff),
        P.u32(f"{a}.expert_feed_forward_length", spec.n_ff_exp),
        P.u32(f"{a}.interleave_moe_layer_step", merge_opts(spec, OPTS)["moe_step"]),
    ])
