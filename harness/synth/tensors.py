"""What a planned tensor is (pure): its name, shape in ggml order, type and how it is initialised, the types'
block sizes, the weight scales, and the constructors of the common kinds (linear weights, norms, vectors, routed
experts). The archs' tensor lists are built from them in harness.synth.archs; plan.py places them in shards,
fill.py generates their bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from harness.synth.spec import ModelSpec

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
    # | "const" (f32, all = std) | "eye" (row r is std at column r, else 0)
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
