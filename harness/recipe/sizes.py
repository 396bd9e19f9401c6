"""The recipe's sizes, declared once: model shape and training schedule. Pure data; the recipe, its tests and the
model card read them from here."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Size:
    name: str
    vocab: int  # BPE vocabulary, the special tokens included
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    expert_ff: int  # moe_intermediate_size
    seq_len: int  # training window
    batch: int  # windows per step
    steps: int
    lr: float
    warmup: int
    aux_coef: float  # router load-balancing loss weight (Switch/Qwen3-MoE style), as in the HF config
    ckpt_every: int
    eval_every: int

    def tokens(self) -> int:
        return self.seq_len * self.batch * self.steps

    def params(self) -> dict[str, int]:
        """Parameter counts from the shape (the model's own count is checked against this in the recipe)."""
        attn = self.layers * (self.hidden * self.heads * self.head_dim * 2  # q, o
                              + self.hidden * self.kv_heads * self.head_dim * 2  # k, v
                              + 2 * self.head_dim + 2 * self.hidden)  # q/k norms, two layer norms
        router = self.layers * self.hidden * self.experts
        experts = self.layers * self.experts * 3 * self.hidden * self.expert_ff
        embed = 2 * self.vocab * self.hidden + self.hidden  # untied input/output embeddings, final norm
        return {"attention": attn, "router": router, "experts": experts, "embeddings": embed,
                "total": attn + router + experts + embed}

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


SIZES: dict[str, Size] = {
    # ~22M parameters; Q4_K_M ~13 MiB, committed in harness/data/models/
    "tiny": Size(name="tiny", vocab=4096, hidden=256, layers=6, heads=4, kv_heads=2, head_dim=64, experts=32,
                 top_k=4, expert_ff=128, seq_len=256, batch=16, steps=1200, lr=2e-3, warmup=40, aux_coef=0.01,
                 ckpt_every=25, eval_every=150),
    # at least 3x the smallest memory cap bmoe has run a model under (144 MiB: bench-data/2026-12-04-roofline-500m):
    # ~453M parameters, Q8_0 ~460 MiB (Q4_K_M ~270 MiB). 256 experts of 256 x 256 per layer, top-8, so a token reads
    # ~15 MiB of Q8_0 experts. Cost measured here (2026-12-04, 3 calibration steps): 56-80 s a step on 1 thread
    # beside another training run, ~9.7 GiB RSS; 600 steps are estimated at 2.5-3 hours on 2 idle cores (not run yet)
    "bench": Size(name="bench", vocab=4096, hidden=256, layers=9, heads=4, kv_heads=2, head_dim=64, experts=256,
                  top_k=8, expert_ff=256, seq_len=256, batch=16, steps=600, lr=1.5e-3, warmup=30, aux_coef=0.01,
                  ckpt_every=20, eval_every=100),
}


def get(name: str) -> Size:
    if name not in SIZES:
        raise KeyError(f"unknown size {name!r}: one of {', '.join(SIZES)}")
    return SIZES[name]
