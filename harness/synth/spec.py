"""What a synthetic model looks like: one dataclass and its validation (pure, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import UserError
from harness.formats.model_fields import ModelFields
from harness.synth.tokenizer import TEMPLATES, specials_for

# arch -> what the writer knows how to lay out. qwen3moe/qwen2moe/gpt-oss are the engine's targets; qwen3 is the
# dense control (the engine must refuse it), olmoe a real llama.cpp MoE arch the engine does not support.
ARCHS: tuple[str, ...] = ("qwen3moe", "qwen2moe", "gpt-oss", "qwen3", "olmoe")
MOE_ARCHS: frozenset[str] = frozenset({"qwen3moe", "qwen2moe", "gpt-oss", "olmoe"})
EXPERT_TYPES: tuple[str, ...] = ("f32", "q8_0", "q4_k", "mxfp4", "q5_0", "iq2_s", "q5_k", "q6_k")
DENSE_TYPES: tuple[str, ...] = ("f32", "f16", "q8_0", "q4_k", "q5_k", "q6_k")
# types a plan can be sized with (make-model --dry-run) but not written: no generator for their blocks, or (q4_k
# dense) no gaussian quantiser
SIZING_ONLY: frozenset[str] = frozenset({"iq2_s"})

# the row length (ne[0]) of a tensor of this type must be a multiple of this
BLOCK_ELEMS: dict[str, int] = {"f32": 1, "f16": 1, "q8_0": 32, "q4_k": 256, "mxfp4": 32, "q5_0": 32, "iq2_s": 256,
                              "q5_k": 256, "q6_k": 256}
# llama-quantize's type for a tensor whose rows are no multiple of the asked k-quant's 256 (llama-quant.cpp's
# fallback: q4_K -> q5_0, q6_K -> q8_0; q5_K -> q5_1, which this writer has no generator for, stays refused)
ROW_FALLBACK: dict[str, str] = {"q4_k": "q5_0", "q6_k": "q8_0"}


@dataclass(frozen=True)
class ModelSpec(ModelFields):
    """A synthetic model: the fields harness.formats.model_fields declares, and what the arch registry says
    of them. Same spec (seed included) -> byte-identical file(s)."""

    def param(self, name: str, default: int) -> int:
        return dict(self.arch_params).get(name, default)

    @property
    def down_type(self) -> str:
        """expert_down_type when set; else the expert type, or llama-quantize's fallback for it when the down rows
        (n_ff_exp long) are no multiple of its block."""
        if self.expert_down_type:
            return self.expert_down_type
        t = self.expert_type
        return ROW_FALLBACK[t] if t in ROW_FALLBACK and self.n_ff_exp % BLOCK_ELEMS[t] else t

    @property
    def is_moe(self) -> bool:
        return self.arch in MOE_ARCHS or arch_module(self.arch) is not None


def arch_module(arch: str):
    """The arch's layout module in harness.synth.archs, or None (imported late: those modules import this one)."""
    from harness.synth import archs

    return archs.find(arch)


def all_archs() -> tuple[str, ...]:
    """The archs the writer lays out: those of archs/_generic.py, then those with a module of their own."""
    from harness.synth import archs

    return ARCHS + tuple(a for a in archs.names() if a not in ARCHS)


def min_vocab(arch: str, template: str = "") -> int:
    """256 byte tokens plus the template's special tokens (ChatML, or harmony for gpt-oss, by default)."""
    return 256 + len(specials_for(arch, template).tokens)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


def validate(spec: ModelSpec) -> None:
    """Refuse a spec llama.cpp could not load, naming the flag to change."""
    mod = arch_module(spec.arch)
    _need(spec.arch in ARCHS or mod is not None, f"--arch {spec.arch!r} is not one of {', '.join(all_archs())}")
    _need(
        spec.expert_type in EXPERT_TYPES,
        f"--expert-type {spec.expert_type!r} is not one of {', '.join(EXPERT_TYPES)}",
    )
    _need(
        spec.dense_type in DENSE_TYPES,
        f"--dense-type {spec.dense_type!r} is not one of {', '.join(DENSE_TYPES)}",
    )
    for flag, val in (
        ("--layers", spec.n_layer),
        ("--embd", spec.n_embd),
        ("--heads", spec.n_head),
        ("--heads-kv", spec.n_head_kv),
        ("--head-dim", spec.head_dim),
        ("--ctx", spec.ctx_len),
        ("--split", spec.n_split),
    ):
        _need(val >= 1, f"{flag} must be at least 1 (got {val})")
    _need(spec.seed >= 0, f"--seed must be >= 0 (got {spec.seed})")
    _need(not spec.expert_used_per_layer or len(spec.expert_used_per_layer) == spec.n_layer,
          f"expert_used_per_layer has {len(spec.expert_used_per_layer)} values for {spec.n_layer} layers")
    _need(
        not spec.chat_template or spec.chat_template in TEMPLATES,
        f"--chat-template {spec.chat_template!r} is not one of {', '.join(TEMPLATES)}",
    )
    n_min = min_vocab(spec.arch, spec.chat_template)
    _need(
        spec.n_vocab >= n_min,
        f"--vocab must be at least {n_min} (256 bytes + {n_min - 256} specials), got {spec.n_vocab}",
    )
    _need(
        spec.n_head % spec.n_head_kv == 0,
        f"--heads ({spec.n_head}) must be a multiple of --heads-kv ({spec.n_head_kv})",
    )
    _need(spec.head_dim % 2 == 0, f"--head-dim must be even for RoPE (got {spec.head_dim})")
    if spec.is_moe:
        _need(spec.n_expert >= 1, f"--experts must be at least 1 (got {spec.n_expert})")
        _need(
            1 <= spec.n_expert_used <= spec.n_expert,
            f"--top-k must be between 1 and --experts ({spec.n_expert}), got {spec.n_expert_used}",
        )
        _need(spec.n_ff_exp >= 1, f"--expert-ff must be at least 1 (got {spec.n_ff_exp})")
        blk = BLOCK_ELEMS[spec.expert_type]
        # gate/up rows are n_embd long, down rows n_ff_exp long
        _need(
            spec.n_embd % blk == 0,
            f"--embd {spec.n_embd} is not a multiple of {blk}, which --expert-type {spec.expert_type} needs",
        )
        _need(
            not spec.expert_down_type or spec.expert_down_type in EXPERT_TYPES,
            f"expert_down_type {spec.expert_down_type!r} is not one of {', '.join(EXPERT_TYPES)}",
        )
        dblk_down = BLOCK_ELEMS[spec.down_type]
        _need(
            spec.n_ff_exp % dblk_down == 0,
            f"--expert-ff {spec.n_ff_exp} is not a multiple of {dblk_down}, "
            f"which the down projection's type {spec.down_type} needs"
            + (f" (llama-quantize's fallback for {spec.expert_type})" if spec.down_type != spec.expert_type else ""),
        )
    if spec.arch in ("qwen2moe", "olmoe"):
        # these archs size wq/wo as n_embd x n_embd
        _need(
            spec.n_head * spec.head_dim == spec.n_embd,
            f"--arch {spec.arch} needs --heads x --head-dim == --embd "
            f"({spec.n_head} x {spec.head_dim} != {spec.n_embd})",
        )
    if spec.arch == "olmoe":
        _need(
            spec.n_head_kv == spec.n_head,
            f"--arch olmoe needs --heads-kv == --heads (its k-norm spans n_embd), got {spec.n_head_kv}",
        )
    if spec.arch == "qwen2moe":
        _need(spec.n_ff_shexp >= 1, f"--shared-ff must be at least 1 (got {spec.n_ff_shexp})")
    if spec.arch == "gpt-oss":
        _need(spec.n_swa >= 1, f"--swa must be at least 1 (got {spec.n_swa})")
    if spec.arch == "qwen3":
        _need(spec.n_ff >= 1, f"--dense-ff must be at least 1 (got {spec.n_ff})")
    dblk = BLOCK_ELEMS[spec.dense_type]
    for flag, width in (("--embd", spec.n_embd), ("--heads x --head-dim", spec.n_head * spec.head_dim)):
        _need(
            width % dblk == 0,
            f"{flag} ({width}) is not a multiple of {dblk}, which --dense-type {spec.dense_type} needs",
        )
    if spec.arch == "qwen2moe":
        _need(
            spec.n_ff_shexp % dblk == 0,
            f"--shared-ff {spec.n_ff_shexp} is not a multiple of {dblk}, "
            f"which --dense-type {spec.dense_type} needs",
        )
    if spec.arch == "qwen3":
        _need(
            spec.n_ff % dblk == 0,
            f"--dense-ff {spec.n_ff} is not a multiple of {dblk}, which --dense-type {spec.dense_type} needs",
        )
    if mod is not None and hasattr(mod, "validate"):
        mod.validate(spec)
