"""Which tensors a synthetic model holds, per architecture (pure): names, shapes in ggml order, types and
how each is initialised. The set must be exactly what llama.cpp's loader creates for the arch (an extra tensor
is fatal); plan.py places them in shards, fill.py generates their bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.synth import tokenizer as tok
from harness.synth.spec import ModelSpec, arch_module

GGML_TYPE_ID: dict[str, int] = {"f32": 0, "f16": 1, "q8_0": 8, "q4_k": 12, "mxfp4": 39, "i32": 26, "q5_0": 6,
                                "iq2_s": 22, "q5_k": 13, "q6_k": 14}
# dtype -> (elements per block, bytes per block)
BLOCK: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "q8_0": (32, 34),
    "q4_k": (256, 144),
    "mxfp4": (32, 17),
    "i32": (1, 4),  # index tables (deepseek4's token -> expert map)
    "q5_0": (32, 22),
    "iq2_s": (256, 82),  # sizing only (spec.SIZING_ONLY)
    "q5_k": (256, 176),
    "q6_k": (256, 210),
}

# Weight scales, chosen so that a random model gives varied greedy output that depends on every routed expert:
# the router is sharp enough that routing changes token to token, the experts' output is comparable to the
# residual stream, and the output head is sharp enough that the argmax follows the hidden state.
ROUTER_GAIN = 4.0
EXPERT_GAIN = 1.0
DOWN_GAIN = 3.0
OUTPUT_GAIN = 4.0
# gpt-oss's extra f32 vectors: per-expert biases (added to the selected experts' gate/up/down outputs), the
# router's bias and the attention sinks (one logit per head). Each is read by the graph, so each must matter.
EXPERT_BIAS_STD = 0.5
ROUTER_BIAS_STD = 1.0
SINK_STD = 1.0


@dataclass(frozen=True)
class TensorPlan:
    name: str
    ne: tuple[int, ...]
    dtype: str  # f32 | f16 | q8_0 | q4_k | mxfp4 | i32 | q5_0 | q5_k | q6_k
    init: str  # "normal" (gaussian, quantised if needed) | "ones" | "blocks" (random quant blocks) | "one_plus"
    # (f32 1 + std * gaussian: scales) | "expert_ids" (i32 rows of ne[0] distinct ids below `std`)
    # | "const" (f32, all = std)
    std: float = 0.0
    zero_rows: tuple[int, ...] = ()  # rows (index along ne[1]) forced to zero
    layer: int = -1
    expert_role: str = ""  # "gate" | "up" | "down" for routed expert tensors

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def nbytes(self) -> int:
        blk, size = BLOCK[self.dtype]
        return self.n_elements // blk * size

    @property
    def row_bytes(self) -> int:
        blk, size = BLOCK[self.dtype]
        return self.ne[0] // blk * size


def _lin(name: str, n_in: int, n_out: int, dtype: str, layer: int, gain: float = 1.0) -> TensorPlan:
    # quantised dense weights are random blocks like the experts: quantising gaussians is ~20x slower
    init = "normal" if dtype in ("f32", "f16") else "blocks"
    return TensorPlan(name, (n_in, n_out), dtype, init, gain / math.sqrt(n_in), layer=layer)


def _ones(name: str, n: int, layer: int) -> TensorPlan:
    return TensorPlan(name, (n,), "f32", "ones", layer=layer)


def _experts(spec: ModelSpec, il: int, width: int) -> list[TensorPlan]:
    e, d, et = spec.n_expert, spec.n_embd, spec.expert_type
    init = "normal" if et == "f32" else "blocks"
    return [
        TensorPlan(
            f"blk.{il}.ffn_gate_exps.weight",
            (d, width, e),
            et,
            init,
            EXPERT_GAIN / math.sqrt(d),
            (),
            il,
            "gate",
        ),
        TensorPlan(
            f"blk.{il}.ffn_up_exps.weight", (d, width, e), et, init, EXPERT_GAIN / math.sqrt(d), (), il, "up"
        ),
        TensorPlan(
            f"blk.{il}.ffn_down_exps.weight",
            (width, d, e),
            spec.down_type,
            "normal" if spec.down_type == "f32" else "blocks",
            DOWN_GAIN / math.sqrt(width),
            (),
            il,
            "down",
        ),
    ]


def _vec(name: str, ne: tuple[int, ...], std: float, layer: int) -> TensorPlan:
    return TensorPlan(name, ne, "f32", "normal", std, layer=layer)


def _gptoss_layer(spec: ModelSpec, il: int) -> list[TensorPlan]:
    """Exactly the tensors llama.cpp's gpt-oss loader creates (an extra one is fatal), with the optional q/k/v
    biases the published files carry. No ffn_norm: post_attention_norm is the MoE input's norm."""
    d, dt, hd, e, ff = spec.n_embd, spec.dense_type, spec.head_dim, spec.n_expert, spec.n_ff_exp
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    p = f"blk.{il}."
    return [
        _ones(p + "attn_norm.weight", d, il),
        _lin(p + "attn_q.weight", d, n_q, dt, il),
        _vec(p + "attn_q.bias", (n_q,), 0.1, il),
        _lin(p + "attn_k.weight", d, n_kv, dt, il),
        _vec(p + "attn_k.bias", (n_kv,), 0.1, il),
        _lin(p + "attn_v.weight", d, n_kv, dt, il),
        _vec(p + "attn_v.bias", (n_kv,), 0.1, il),
        _lin(p + "attn_output.weight", n_q, d, dt, il),
        _vec(p + "attn_output.bias", (d,), 0.1, il),
        _vec(p + "attn_sinks.weight", (spec.n_head,), SINK_STD, il),
        _ones(p + "post_attention_norm.weight", d, il),
        TensorPlan(p + "ffn_gate_inp.weight", (d, e), "f32", "normal", ROUTER_GAIN / math.sqrt(d), layer=il),
        _vec(p + "ffn_gate_inp.bias", (e,), ROUTER_BIAS_STD, il),
        # resident beside the streamed experts: one expert's three bias rows are 4*(2*ff + d) bytes
        _vec(p + "ffn_gate_exps.bias", (ff, e), EXPERT_BIAS_STD, il),
        _vec(p + "ffn_up_exps.bias", (ff, e), EXPERT_BIAS_STD, il),
        _vec(p + "ffn_down_exps.bias", (d, e), EXPERT_BIAS_STD, il),
        *_experts(spec, il, ff),
    ]


def _layer_tensors(spec: ModelSpec, il: int) -> list[TensorPlan]:
    if spec.arch == "gpt-oss":
        return _gptoss_layer(spec, il)
    d, dt, hd = spec.n_embd, spec.dense_type, spec.head_dim
    n_q, n_kv = spec.n_head * hd, spec.n_head_kv * hd
    p = f"blk.{il}."
    out = [
        _ones(p + "attn_norm.weight", d, il),
        _lin(p + "attn_q.weight", d, n_q, dt, il),
        _lin(p + "attn_k.weight", d, n_kv, dt, il),
        _lin(p + "attn_v.weight", d, n_kv, dt, il),
        _lin(p + "attn_output.weight", n_q, d, dt, il),
    ]
    if spec.arch in ("qwen3moe", "qwen3"):
        out += [_ones(p + "attn_q_norm.weight", hd, il), _ones(p + "attn_k_norm.weight", hd, il)]
    elif spec.arch == "olmoe":
        out += [_ones(p + "attn_q_norm.weight", n_q, il), _ones(p + "attn_k_norm.weight", n_kv, il)]
    out.append(_ones(p + "ffn_norm.weight", d, il))
    if spec.arch == "qwen3":
        return out + [
            _lin(p + "ffn_gate.weight", d, spec.n_ff, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_up.weight", d, spec.n_ff, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_down.weight", spec.n_ff, d, dt, il, DOWN_GAIN),
        ]
    # router in f32, as converted models have it
    out.append(
        TensorPlan(
            p + "ffn_gate_inp.weight",
            (d, spec.n_expert),
            "f32",
            "normal",
            ROUTER_GAIN / math.sqrt(d),
            layer=il,
        )
    )
    width = spec.n_ff_exp
    out += _experts(spec, il, width)
    if spec.arch == "qwen2moe":
        out += [
            TensorPlan(p + "ffn_gate_inp_shexp.weight", (d,), "f32", "normal", 1.0 / math.sqrt(d), layer=il),
            _lin(p + "ffn_gate_shexp.weight", d, spec.n_ff_shexp, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_up_shexp.weight", d, spec.n_ff_shexp, dt, il, EXPERT_GAIN),
            _lin(p + "ffn_down_shexp.weight", spec.n_ff_shexp, d, dt, il, DOWN_GAIN),
        ]
    return out


def plan_tensors(spec: ModelSpec) -> list[TensorPlan]:
    mod = arch_module(spec.arch)
    if mod is not None:
        return mod.tensors(spec)
    vocab_ctrl = tuple(tok.build_vocab(spec.n_vocab, tok.specials_for(spec.arch, spec.chat_template)).control_ids)
    d, dt = spec.n_embd, spec.dense_type
    out = [TensorPlan("token_embd.weight", (d, spec.n_vocab), dt, "normal", 1.0)]
    for il in range(spec.n_layer):
        out += _layer_tensors(spec, il)
    out.append(_ones("output_norm.weight", d, -1))
    out.append(
        TensorPlan("output.weight", (d, spec.n_vocab), dt, "normal", OUTPUT_GAIN / math.sqrt(d), vocab_ctrl)
    )
    return out
