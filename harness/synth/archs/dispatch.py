"""Name -> per-architecture layout module, and the pieces of a plan they produce (pure). Each module has
ARCH, DENSE_LEAD and NEXTN (its tiny model's defaults), check(spec) (problems, one line each), kvs(spec) (its
metadata: added to, or replacing, the common keys) and layer(spec, il) (exactly the tensors its loader creates
for layer il)."""

from __future__ import annotations

from types import ModuleType

from harness.errors import UserError
from harness.synth import tokenizer as tok
from harness.synth.archs import (
    bailingmoe2,
    deepseek2,
    dots1,
    ernie4_5_moe,
    glm4moe,
    granitemoe,
    hunyuan_moe,
    llama,
)
from harness.synth.gguf_encode import KV
from harness.synth.spec import ModelSpec
from harness.synth.tensors import OUTPUT_GAIN, TensorPlan, _ones

LAYOUTS: dict[str, ModuleType] = {
    m.ARCH: m for m in (granitemoe, llama, deepseek2, glm4moe, ernie4_5_moe, hunyuan_moe, dots1, bailingmoe2)
}


def check(spec: ModelSpec) -> None:
    problems = LAYOUTS[spec.arch].check(spec)
    if problems:
        raise UserError(problems[0])


def plan_tensors(spec: ModelSpec) -> list[TensorPlan]:
    mod = LAYOUTS[spec.arch]
    ctrl = tuple(tok.build_vocab(spec.n_vocab, tok.specials_for(spec.arch, spec.chat_template)).control_ids)
    d = spec.n_embd
    out = [TensorPlan("token_embd.weight", (d, spec.n_vocab), spec.dense_type, "normal", 1.0)]
    for il in range(spec.n_layer):
        out += mod.layer(spec, il)
    out.append(_ones("output_norm.weight", d, -1))
    out.append(TensorPlan("output.weight", (d, spec.n_vocab), spec.dense_type, "normal", OUTPUT_GAIN / d**0.5, ctrl))
    return out


def patch_kvs(spec: ModelSpec, kvs: list[KV]) -> list[KV]:
    """The common keys with the architecture's own replacing those of the same name; new ones follow the last
    key of the architecture's namespace."""
    own = {kv.key: kv for kv in LAYOUTS[spec.arch].kvs(spec)}
    out = [own.pop(kv.key, kv) for kv in kvs]
    last = max(i for i, kv in enumerate(out) if kv.key.startswith(spec.arch + "."))
    return out[: last + 1] + list(own.values()) + out[last + 1:]
