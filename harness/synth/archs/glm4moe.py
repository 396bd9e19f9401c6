"""glm4moe (GLM-4.5): q/k/v with biases, a post-attention norm as the FFN's input norm, leading dense blocks,
routed experts with sigmoid gating and the exp_probs_b selection bias, a shared expert, and a nextn (MTP) layer
counted in block_count: its tensors are in the file (llama.cpp loads them only for MTP) but it is not part of
the trunk's graph. Here n_layer counts the nextn layer (the last one)."""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.synth.archs import _parts as P
from harness.synth.archs import param
from harness.synth.spec import ModelSpec

ARCH = "glm4moe"
SPEC_DEFAULTS: dict[str, Any] = {}
# leading dense blocks; nextn layers, the last ones; mtp_bigram=G > 0: a nextn head whose drafts are often right
# (harness.synth.archs._parts.nextn_block; G = 10 keeps about a quarter of --mtp's drafts), for --mtp's gates
PARAMS: dict[str, int] = dict(n_dense_lead=1, n_nextn=1, mtp_bigram=0)


def validate(spec: ModelSpec) -> None:
    n = param(spec, PARAMS, "n_nextn")
    if n > 1:
        raise UserError("--arch glm4moe: llama.cpp supports a single nextn (MTP) layer")
    if spec.n_layer - n <= param(spec, PARAMS, "n_dense_lead"):
        raise UserError("--arch glm4moe: --layers leaves no MoE layer in the trunk (1 leading dense, 1 nextn)")


def kvs(spec: ModelSpec, base: list[P.KV]) -> list[P.KV]:
    a = ARCH
    own = [*P.lead_kvs(spec, param(spec, PARAMS, "n_dense_lead")),
           P.u32(f"{a}.nextn_predict_layers", param(spec, PARAMS, "n_nextn")),
           P.u32(f"{a}.feed_forward_length", spec.n_ff), *P.sigmoid_shared_kvs(spec)]
    return P.override(base, own)


def layer(spec: ModelSpec, il: int) -> list[P.TensorPlan]:
    out = [*P.qkvo(spec, il, norm=True, bias=True), P._ones(f"blk.{il}.post_attention_norm.weight", spec.n_embd, il),
           *P.lead_dense_ffn(spec, il, param(spec, PARAMS, "n_dense_lead"), spec.n_ff_exp)]
    if il >= spec.n_layer - param(spec, PARAMS, "n_nextn"):
        out += P.nextn_block(spec, il, param(spec, PARAMS, "mtp_bigram"))
    return out


def tensors(spec: ModelSpec) -> list[P.TensorPlan]:
    return P.bigram_embedding(P.model_tensors(spec, layer), param(spec, PARAMS, "mtp_bigram"))
