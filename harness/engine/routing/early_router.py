"""A deterministic early router: any MoE layer's router applied to a hidden state, in numpy.

`EarlyRouter.load(layout, k)` reads every MoE layer's router (`blk.<l>.ffn_gate_inp.weight`, dequantised once
with the gguf package; its `.bias` and the selection bias `blk.<l>.exp_probs_b.bias` where the file has them) and
the architecture's gating. `predict(layer, hidden)` returns the top-k expert ids that layer `layer`'s router picks
for `hidden` (float32 [n_tok, n_embd]), which may be taken at an EARLIER layer (route-ahead, predictive prefetch).

The selection follows llama.cpp's shared MoE builder: logits = W x (+ router bias); probs = the gate (softmax,
sigmoid, none, sqrt(softplus)); selection score = probs (+ exp_probs_b); with expert groups, only the
`expert_group_used_count` groups with the largest sum of their two best scores stay; then the top k. The ids come
out best first, ties broken by the lower expert id, so a prediction never depends on anything but its input.
Without a selection bias or groups every gate is monotone, so the gate does not change the choice.
Measured on generated models, each layer's own router on the hook's tap at that layer reproduces llama.cpp's choice
for qwen3moe, minimax-m2, gpt-oss, deepseek2 and glm4moe. Not modelled (`NOT_MODELLED`): gemma4's router reads its
own normalised input (39% agreement there), and llama4 weights the expert matmuls' input, so it has no tap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from harness.engine.model.gguf_layout import DenseTensor, ModelLayout, read_header
from harness.errors import UserError

NONE, SOFTMAX, SIGMOID, SOFTMAX_WEIGHT, SQRT_SOFTPLUS = 0, 1, 2, 3, 4  # llama_expert_gating_func_type
# architectures whose graph passes a fixed gate to the MoE builder (the file's key is not read there)
_FIXED_GATE = {"qwen3moe": SOFTMAX, "qwen2moe": SOFTMAX, "ernie4_5-moe": SOFTMAX, "gemma4": SOFTMAX,
               "gpt-oss": SOFTMAX_WEIGHT, "olmoe": SOFTMAX, "granitemoe": SOFTMAX, "llama": SOFTMAX,
               "hunyuan-moe": SOFTMAX, "llama4": SIGMOID}
# the loader's fallback where the file's key is absent (NONE)
_DEFAULT_GATE = {"glm4moe": SIGMOID}
# architectures whose router the early router does not reproduce on the tapped MoE input: why
NOT_MODELLED = {"gemma4": "its router reads a normalised input of its own, not the MoE input the tap hands out",
                "llama4": "it multiplies the router weights into the expert matmuls' input, so there is no tap"}


@dataclass(frozen=True)
class LayerRouter:
    weight: np.ndarray  # float32 [n_expert, n_embd]
    bias: np.ndarray | None  # float32 [n_expert]: added to the logits (gpt-oss)
    select_bias: np.ndarray | None  # float32 [n_expert]: exp_probs_b, added to the probs for the choice only


def _read_tensor(t: DenseTensor) -> np.ndarray:
    """A dense tensor's values as float32, numpy order (the ggml shape reversed)."""
    qt = GGMLQuantizationType(t.ggml_type)
    with open(t.path, "rb") as f:
        f.seek(t.abs_offset)
        raw = f.read(t.nbytes)
    if len(raw) != t.nbytes:
        raise UserError(f"{t.path}: {t.name} is cut short; the file is incomplete, generate or download it again")
    rows = int(np.prod(t.shape[1:], dtype=np.int64)) if len(t.shape) > 1 else 1
    data = np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)
    out = dequantize(data, qt).astype(np.float32, copy=False)
    return np.ascontiguousarray(out.reshape(tuple(reversed(t.shape))))


def gating_of(arch: str, kv: dict[str, object]) -> int:
    if arch in _FIXED_GATE:
        return _FIXED_GATE[arch]
    v = int(kv.get(f"{arch}.expert_gating_func", NONE) or NONE)
    return v if v != NONE else _DEFAULT_GATE.get(arch, SOFTMAX)


def _gate(logits: np.ndarray, gating: int) -> np.ndarray:
    if gating == SOFTMAX:
        m = logits.max(axis=1, keepdims=True)
        e = np.exp(logits - m)
        return e / e.sum(axis=1, keepdims=True)
    if gating == SIGMOID:
        return 1.0 / (1.0 + np.exp(-logits))
    if gating == SQRT_SOFTPLUS:
        return np.sqrt(np.logaddexp(0.0, logits))
    return logits  # NONE, SOFTMAX_WEIGHT: the softmax comes after the choice


def top_k_ids(score: np.ndarray, k: int) -> np.ndarray:
    """Per row, the k best columns, best first, ties to the lower column (int32 [n, k])."""
    order = np.argsort(-score, axis=1, kind="stable")
    return np.ascontiguousarray(order[:, :k], dtype=np.int32)


class EarlyRouter:
    def __init__(self, routers: dict[int, LayerRouter], k: int, gating: int, n_groups: int = 0, groups_used: int = 0):
        self.routers = routers
        self.k = k
        self.gating = gating
        self.n_groups = n_groups
        self.groups_used = groups_used

    @classmethod
    def load(cls, layout: ModelLayout, k: int) -> EarlyRouter:
        """Every MoE layer's router from the model file (read once, dequantised to float32)."""
        kv = read_header(layout.shards[0]).kv
        arch = layout.arch
        routers: dict[int, LayerRouter] = {}
        for il in layout.moe_layers:
            w = layout.dense.get(f"blk.{il}.ffn_gate_inp.weight")
            if w is None:
                raise UserError(f"{layout.shards[0]}: layer {il} has no blk.{il}.ffn_gate_inp.weight router; the "
                                "early router needs one per MoE layer")
            b = layout.dense.get(f"blk.{il}.ffn_gate_inp.bias")
            sb = layout.dense.get(f"blk.{il}.exp_probs_b.bias")
            routers[il] = LayerRouter(_read_tensor(w), _read_tensor(b).reshape(-1) if b else None,
                                      _read_tensor(sb).reshape(-1) if sb else None)
        groups = int(kv.get(f"{arch}.expert_group_count", 0) or 0)
        used = int(kv.get(f"{arch}.expert_group_used_count", 0) or 0)
        return cls(routers, k, gating_of(arch, kv), groups if groups > 1 else 0, used)

    def scores(self, layer: int, hidden: np.ndarray, ranking_only: bool = False) -> np.ndarray:
        """The selection scores layer `layer`'s router gives `hidden` (float32 [n_tok, n_expert]). With
        `ranking_only`, a monotone gate is skipped where nothing is added after it (the same order, cheaper)."""
        r = self.routers[layer]
        h = np.asarray(hidden, dtype=np.float32).reshape(-1, r.weight.shape[1])
        logits = h @ r.weight.T
        if r.bias is not None:
            logits = logits + r.bias
        if ranking_only and r.select_bias is None and not self.n_groups:
            return logits
        s = _gate(logits, self.gating)
        if r.select_bias is not None:
            s = s + r.select_bias
        if self.n_groups:
            n_tok, n_exp = s.shape
            g = s.reshape(n_tok, self.n_groups, n_exp // self.n_groups)
            best2 = -np.sort(-g, axis=2)[:, :, :2].sum(axis=2)  # [n_tok, n_groups]
            keep = top_k_ids(best2, self.groups_used)
            mask = np.ones((n_tok, self.n_groups), dtype=bool)
            np.put_along_axis(mask, keep, False, axis=1)
            g = np.where(mask[:, :, None], -np.inf, g)
            s = g.reshape(n_tok, n_exp)
        return s

    def predict(self, layer: int, hidden: np.ndarray) -> np.ndarray:
        """Layer `layer`'s top-k expert ids for `hidden` (int32 [n_tok, k]), best first."""
        return top_k_ids(self.scores(layer, hidden, ranking_only=True), self.k)


def slot_agreement(committed: np.ndarray, true: np.ndarray) -> tuple[int, int]:
    """(slots whose committed expert is among the true top-k of its token, slots): a route's accuracy."""
    c = np.asarray(committed).reshape(len(true), -1)
    t = np.asarray(true).reshape(len(c), -1)
    hit = sum(int(np.isin(c[i], t[i]).sum()) for i in range(len(c)))
    return hit, int(c.size)
